// Built when arcpool's kernels are off: there is no CUDA workload.
#include "workload.hpp"

namespace arcpool::kernels {

std::unique_ptr<workload> make_cuda_workload() {
  return nullptr;
}

}  // namespace arcpool::kernels
