// The PyTorch shim's C functions (python/arcpool_torch.cpp) called in the order PyTorch's
// pluggable allocator calls them, on CUDA streams the shim does not know (torch's). On simcuda,
// whose race checker sees every free that runs before a use; PyTorch itself needs a GPU
// (tests/python/test_torch.py).
#include <gtest/gtest.h>

#include "conformance/conformance.hpp"

extern "C" {
void* arcpool_torch_malloc(size_t size, int device, cudaStream_t stream);
void arcpool_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
void arcpool_torch_record_stream(void* ptr, cudaStream_t stream);
void arcpool_torch_empty_cache();
}

namespace conformance {
namespace {

using TorchShim = Conformance;

TEST_F(TorchShim, RecordStreamCoversSideWorkQueuedBeforeTheFree) {
  CONFORMANCE_SIMCUDA_ONLY();
  // Tensor.record_stream: no reuse until the side stream's work queued at deallocation time
  // has completed, including work queued after record_stream.
  words w;
  cudaStream_t main_stream = nullptr, side = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  constexpr size_t kBytes = 1 << 20;
  void* p = arcpool_torch_malloc(kBytes, 0, main_stream);
  ASSERT_NE(nullptr, p);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(main_stream));  // side's use follows it
  arcpool_torch_record_stream(p, side);
  w.gate(side, 0);
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, 1, kBytes, side));  // after record_stream
  arcpool_torch_free(p, kBytes, 0, main_stream);  // PyTorch frees on the allocation stream
  w.settle();  // a free that did not wait for the memset would be queued by now
  w.open(0);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(side));
  arcpool_torch_empty_cache();  // completes the deferred free
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(main_stream);
  cudaStreamDestroy(side);
}

}  // namespace
}  // namespace conformance
