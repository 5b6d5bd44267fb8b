#include "conformance.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace conformance {
namespace {

using value_fn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

constexpr int kWords = 256;

}  // namespace

bool gpu_required() {
  const char* env = std::getenv("ARCPOOL_REQUIRE_GPU");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

std::string no_device_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e);
  }
  return count > 0 ? std::string() : std::string("no devices");
}

words::words() {
  void* host = nullptr;
  EXPECT_EQ(cudaSuccess, cudaHostAlloc(&host, kWords * sizeof(uint32_t), cudaHostAllocMapped));
  host_ = static_cast<uint32_t*>(host);
  if (host_ == nullptr) return;
  std::memset(host_, 0, kWords * sizeof(uint32_t));
  void* device = nullptr;
  EXPECT_EQ(cudaSuccess, cudaHostGetDevicePointer(&device, host_, 0));
  device_ = reinterpret_cast<CUdeviceptr>(device);
}

words::~words() {
  for (int i = 0; host_ != nullptr && i < kWords; ++i)
    open(i);
  cudaDeviceSynchronize();
  if (host_ != nullptr) cudaFreeHost(host_);
}

void words::gate(cudaStream_t s, int i) {
  static const value_fn wait = driver_function<value_fn>("cuStreamWaitValue32");
  ASSERT_NE(nullptr, wait);
  ASSERT_EQ(CUDA_SUCCESS, wait(reinterpret_cast<CUstream>(s), device_ + i * sizeof(uint32_t), 1,
                               CU_STREAM_WAIT_VALUE_GEQ));
}

void words::open(int i) {
  __atomic_store_n(&host_[i], 1u, __ATOMIC_RELEASE);
}

void words::mark(cudaStream_t s, int i) {
  static const value_fn write = driver_function<value_fn>("cuStreamWriteValue32");
  ASSERT_NE(nullptr, write);
  ASSERT_EQ(CUDA_SUCCESS, write(reinterpret_cast<CUstream>(s), device_ + i * sizeof(uint32_t), 1,
                                CU_STREAM_WRITE_VALUE_DEFAULT));
}

bool words::reached(int i) const {
  return __atomic_load_n(&host_[i], __ATOMIC_ACQUIRE) == 1;
}

void words::settle() {
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void Conformance::SetUp() {
  CONFORMANCE_REQUIRE_DEVICE();
  ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
}

void Conformance::TearDown() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaGetLastError();
  if (const std::string v = arcpool::test::take_simcuda_violations(); !v.empty()) {
    ADD_FAILURE() << "simcuda violations:\n" << v;
  }
}

}  // namespace conformance
