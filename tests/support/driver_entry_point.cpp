#include "support/driver_entry_point.hpp"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace arcpool::test {

void* driver_entry_point(const char* symbol, unsigned version) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaSuccess,
            cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found));
  EXPECT_EQ(cudaDriverEntryPointSuccess, found) << symbol;
  return found == cudaDriverEntryPointSuccess ? fn : nullptr;
}

CUcontext current_context() {
  static const auto get = driver_function<CUresult(CUDAAPI*)(CUcontext*)>("cuCtxGetCurrent");
  CUcontext ctx = nullptr;
  if (get == nullptr || get(&ctx) != CUDA_SUCCESS) ADD_FAILURE() << "cuCtxGetCurrent failed";
  return ctx;
}

}  // namespace arcpool::test
