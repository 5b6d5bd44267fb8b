#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

#include "support/stream_probe.hpp"

namespace arcpool::test {
namespace {

// A gate (cuStreamWaitValue32) holds its stream's hardware queue; with CUDA's default of 8
// queues another stream of the same test could land behind it and seem to wait. 32 queues give
// each of a test's few, consecutively created streams its own. Set before CUDA initializes.
const bool kOwnQueues = setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0) == 0;

// Stream memory operations come from the driver API, reached through the runtime so that the
// test binaries do not need libcuda.so on machines without a GPU.
using stream_value_fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

stream_value_fn driver_entry_point(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaSuccess,
            cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found));
  EXPECT_EQ(cudaDriverEntryPointSuccess, found) << symbol;
  return reinterpret_cast<stream_value_fn>(fn);
}

CUresult stream_wait_value(CUstream s, CUdeviceptr address, cuuint32_t value, unsigned flags) {
  static const stream_value_fn fn = driver_entry_point("cuStreamWaitValue32");
  return fn != nullptr ? fn(s, address, value, flags) : CUDA_ERROR_NOT_FOUND;
}

CUresult stream_write_value(CUstream s, CUdeviceptr address, cuuint32_t value, unsigned flags) {
  static const stream_value_fn fn = driver_entry_point("cuStreamWriteValue32");
  return fn != nullptr ? fn(s, address, value, flags) : CUDA_ERROR_NOT_FOUND;
}

/// One 32-bit word of mapped pinned host memory, visible to the device and the host.
class mapped_word {
 public:
  mapped_word() {
    void* host = nullptr;
    EXPECT_EQ(cudaSuccess, cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped));
    host_ = static_cast<volatile uint32_t*>(host);
    *host_ = 0;
    void* device = nullptr;
    EXPECT_EQ(cudaSuccess, cudaHostGetDevicePointer(&device, const_cast<uint32_t*>(host_), 0));
    device_ = reinterpret_cast<CUdeviceptr>(device);
  }
  ~mapped_word() { cudaFreeHost(const_cast<uint32_t*>(host_)); }
  mapped_word(const mapped_word&) = delete;
  mapped_word& operator=(const mapped_word&) = delete;

  uint32_t load() const { return __atomic_load_n(host_, __ATOMIC_ACQUIRE); }
  void store(uint32_t v) { __atomic_store_n(host_, v, __ATOMIC_RELEASE); }
  CUdeviceptr device() const { return device_; }

 private:
  volatile uint32_t* host_ = nullptr;
  CUdeviceptr device_ = 0;
};

class cuda_gate final : public gate {
 public:
  explicit cuda_gate(arcpool_stream_t s) {
    EXPECT_EQ(CUDA_SUCCESS, stream_wait_value(reinterpret_cast<CUstream>(s), word_.device(), 1,
                                              CU_STREAM_WAIT_VALUE_GEQ));
  }
  // The word must stay mapped until the stream passed the wait: open and let the stream drain.
  ~cuda_gate() override { open(); }
  void open() override { word_.store(1); }

 private:
  mapped_word word_;
};

class cuda_marker final : public marker {
 public:
  explicit cuda_marker(arcpool_stream_t s) {
    EXPECT_EQ(CUDA_SUCCESS, stream_write_value(reinterpret_cast<CUstream>(s), word_.device(), 1,
                                               CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  bool reached() const override { return word_.load() == 1; }

 private:
  mapped_word word_;
};

class cuda_probe final : public stream_probe {
 public:
  std::unique_ptr<gate> block(arcpool_stream_t s) override {
    return std::make_unique<cuda_gate>(s);
  }
  std::shared_ptr<marker> mark(arcpool_stream_t s) override {
    return std::make_shared<cuda_marker>(s);
  }
};

}  // namespace

std::unique_ptr<stream_probe> make_cuda_probe() {
  return std::make_unique<cuda_probe>();
}

}  // namespace arcpool::test
