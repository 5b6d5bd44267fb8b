#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

#include "support/driver_entry_point.hpp"
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

/// Makes the thread's device's primary context current when the thread has none: a driver API
/// call on a thread that made no runtime call yet fails with CUDA_ERROR_INVALID_CONTEXT (seen on
/// an H200, bench/results/2026-12-04-h200), where a runtime call would have made it current.
void ensure_current_context() {
  if (current_context() != nullptr) return;
  int device = 0;
  EXPECT_EQ(cudaSuccess, cudaGetDevice(&device));
  EXPECT_EQ(cudaSuccess, cudaSetDevice(device));
}

CUresult stream_wait_value(CUstream s, CUdeviceptr address, cuuint32_t value, unsigned flags) {
  static const auto fn = driver_function<stream_value_fn>("cuStreamWaitValue32");
  ensure_current_context();
  return fn != nullptr ? fn(s, address, value, flags) : CUDA_ERROR_NOT_FOUND;
}

CUresult stream_write_value(CUstream s, CUdeviceptr address, cuuint32_t value, unsigned flags) {
  static const auto fn = driver_function<stream_value_fn>("cuStreamWriteValue32");
  ensure_current_context();
  return fn != nullptr ? fn(s, address, value, flags) : CUDA_ERROR_NOT_FOUND;
}

/// Mapped pinned host memory for the probe's words, allocated once when the probe is made: a
/// page-locked allocation may synchronize implicitly (programming guide, "Implicit
/// Synchronization"), so one made while a gate holds a stream would queue every later command
/// of the device behind that gate.
class mapped_words {
 public:
  static constexpr size_t kWords = 1024;

  mapped_words() {
    void* host = nullptr;
    EXPECT_EQ(cudaSuccess, cudaHostAlloc(&host, kWords * sizeof(uint32_t), cudaHostAllocMapped));
    host_ = static_cast<uint32_t*>(host);
    void* device = nullptr;
    if (host_ != nullptr) {
      EXPECT_EQ(cudaSuccess, cudaHostGetDevicePointer(&device, host_, 0));
    }
    device_ = reinterpret_cast<CUdeviceptr>(device);
  }
  ~mapped_words() {
    if (host_ != nullptr) cudaFreeHost(host_);
  }
  mapped_words(const mapped_words&) = delete;
  mapped_words& operator=(const mapped_words&) = delete;

  /// The next unused word (zeroed), or -1 when all are taken (a test with over 1024 gates).
  long take() {
    if (host_ == nullptr || next_ == kWords) {
      ADD_FAILURE() << "the CUDA probe ran out of mapped words";
      return -1;
    }
    __atomic_store_n(&host_[next_], 0u, __ATOMIC_RELEASE);
    return static_cast<long>(next_++);
  }
  uint32_t load(long i) const { return i < 0 ? 0 : __atomic_load_n(&host_[i], __ATOMIC_ACQUIRE); }
  void store(long i, uint32_t v) {
    if (i >= 0) __atomic_store_n(&host_[i], v, __ATOMIC_RELEASE);
  }
  CUdeviceptr device(long i) const {
    return device_ + static_cast<CUdeviceptr>(i) * sizeof(uint32_t);
  }

 private:
  uint32_t* host_ = nullptr;
  CUdeviceptr device_ = 0;
  size_t next_ = 0;
};

class cuda_gate final : public gate {
 public:
  cuda_gate(mapped_words& words, arcpool_stream_t s) : words_(words), word_(words.take()) {
    if (word_ < 0) return;
    EXPECT_EQ(CUDA_SUCCESS, stream_wait_value(reinterpret_cast<CUstream>(s), words_.device(word_),
                                              1, CU_STREAM_WAIT_VALUE_GEQ));
  }
  // The word must stay mapped until the stream passed the wait: open and let the stream drain.
  ~cuda_gate() override { open(); }
  void open() override { words_.store(word_, 1); }

 private:
  mapped_words& words_;
  const long word_;
};

class cuda_marker final : public marker {
 public:
  cuda_marker(mapped_words& words, arcpool_stream_t s) : words_(words), word_(words.take()) {
    if (word_ < 0) return;
    EXPECT_EQ(CUDA_SUCCESS, stream_write_value(reinterpret_cast<CUstream>(s), words_.device(word_),
                                               1, CU_STREAM_WRITE_VALUE_DEFAULT));
  }
  bool reached() const override { return words_.load(word_) == 1; }

 private:
  const mapped_words& words_;
  const long word_;
};

class cuda_probe final : public stream_probe {
 public:
  std::unique_ptr<gate> block(arcpool_stream_t s) override {
    return std::make_unique<cuda_gate>(words_, s);
  }
  std::shared_ptr<marker> mark(arcpool_stream_t s) override {
    return std::make_shared<cuda_marker>(words_, s);
  }

 private:
  mapped_words words_;  // outlives the gates and markers: the fixture resets the probe last
};

}  // namespace

std::unique_ptr<stream_probe> make_cuda_probe() {
  return std::make_unique<cuda_probe>();
}

}  // namespace arcpool::test
