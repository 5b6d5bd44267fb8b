// The PyTorch shim's C functions (python/arcpool_torch.cpp) called in the order PyTorch's
// pluggable allocator calls them, on CUDA streams the shim does not know (torch's). On simcuda,
// whose race checker sees every free that runs before a use; PyTorch itself needs a GPU
// (tests/python/test_torch.py).
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

#include "conformance/conformance.hpp"

extern "C" {
void* arcpool_torch_malloc(size_t size, int device, cudaStream_t stream);
void arcpool_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
void arcpool_torch_record_stream(void* ptr, cudaStream_t stream);
void arcpool_torch_empty_cache();
void arcpool_torch_set_memory_fraction(double fraction, int device);
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

/// Device 0's memory that no pool or allocation holds (cudaMemGetInfo's free bytes).
size_t free_memory() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaSuccess, cudaMemGetInfo(&free_bytes, &total));
  return free_bytes;
}

TEST_F(TorchShim, EmptyCacheGivesBackMemoryFreedOnTorchsStreams) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.empty_cache after a tensor on one of torch's streams died: cudaMemPoolTrimTo
  // keeps frees the host has not seen complete, and arcpool cannot synchronize torch's streams
  // (it does not know them), so the shim synchronizes the device first, as PyTorch does.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr size_t kBytes = size_t{64} << 20;  // above the stream caches' largest block
  arcpool_torch_empty_cache();
  const size_t before = free_memory();
  void* p = arcpool_torch_malloc(kBytes, 0, s);
  ASSERT_NE(nullptr, p);
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, 1, kBytes, s));
  EXPECT_LE(free_memory() + kBytes, before);
  arcpool_torch_free(p, kBytes, 0, s);
  arcpool_torch_empty_cache();
  EXPECT_GE(free_memory(), before) << "memory freed on torch's stream stayed reserved";
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, EmptyCacheDuringACaptureRaisesAsPyTorchsOwnDoes) {
  CONFORMANCE_SIMCUDA_ONLY();
  // PyTorch's cudaMallocAsync backend: C10_CUDA_CHECK(cudaDeviceSynchronize()) raises while a
  // stream captures. The shim's synchronization fails the same way, and said nothing.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* p = arcpool_torch_malloc(4096, 0, s);  // the shim has used device 0
  ASSERT_NE(nullptr, p);
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  try {
    arcpool_torch_empty_cache();
    ADD_FAILURE() << "empty_cache during a capture returned as if it had trimmed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(nullptr, std::strstr(e.what(), "empty_cache failed")) << e.what();
  }
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &graph));
  arcpool_torch_free(p, 4096, 0, s);
  arcpool_torch_empty_cache();
  EXPECT_EQ("", take_simcuda_violations());
  cudaStreamDestroy(s);
}

TEST_F(TorchShim, AMemoryFractionOfZeroAllowsNoNewMemory) {
  CONFORMANCE_SIMCUDA_ONLY();
  // torch.cuda.set_per_process_memory_fraction(0.0): PyTorch's own allocator then fails every
  // allocation that needs new memory. arcpool's hard limit of 0 would mean no limit at all.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  arcpool_torch_empty_cache();  // nothing cached from earlier tests
  arcpool_torch_set_memory_fraction(0.0, 0);
  EXPECT_THROW(arcpool_torch_malloc(size_t{1} << 20, 0, s), std::runtime_error);
  arcpool_torch_set_memory_fraction(1.0, 0);
  void* p = arcpool_torch_malloc(size_t{1} << 20, 0, s);
  EXPECT_NE(nullptr, p);
  arcpool_torch_free(p, size_t{1} << 20, 0, s);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace conformance
