// The CUDA workload: arcpool's device kernels, with the verify counters in device memory.
#include <cstdio>

#include "kernels.hpp"
#include "workload.hpp"

namespace arcpool::kernels {
namespace {

arcpool_status_t check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ARCPOOL_STATUS_SUCCESS;
  // The failed call also set this thread's last error: clear it, or the next launch check
  // (cudaGetLastError) would report it again.
  cudaGetLastError();
  std::fprintf(stderr, "arcpool workload: %s failed: %s\n", what, cudaGetErrorName(e));
  return ARCPOOL_STATUS_CUDA_ERROR;
}

cudaStream_t cu(arcpool_stream_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

class cuda_workload final : public workload {
 public:
  cuda_workload() {
    verify_counters initial{0, ~0ull, 0};
    if (cudaMalloc(reinterpret_cast<void**>(&counters_), sizeof(verify_counters)) == cudaSuccess) {
      cudaMemcpy(counters_, &initial, sizeof(initial), cudaMemcpyHostToDevice);
    }
  }
  ~cuda_workload() override { cudaFree(counters_); }

  arcpool_driver_kind_t driver() const override { return ARCPOOL_DRIVER_CUDA; }

  arcpool_status_t fill(void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                        arcpool_stream_t s) override {
    return check(fill_async(p, bytes, tag, first_word, cu(s)), "fill");
  }
  arcpool_status_t verify(const void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                          arcpool_stream_t s) override {
    return check(verify_async(p, bytes, tag, first_word, counters_, cu(s)), "verify");
  }
  arcpool_status_t poison(void* p, size_t bytes, arcpool_stream_t s) override {
    return check(poison_async(p, bytes, cu(s)), "poison");
  }
  arcpool_status_t spin(uint64_t nanoseconds, arcpool_stream_t s) override {
    return check(spin_async(nanoseconds, cu(s)), "spin");
  }
  arcpool_status_t wait_stream(arcpool_stream_t waiter, arcpool_stream_t target) override {
    cudaEvent_t e = nullptr;
    arcpool_status_t status =
        check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    if (status == ARCPOOL_STATUS_SUCCESS) status = check(cudaEventRecord(e, cu(target)), "record");
    if (status == ARCPOOL_STATUS_SUCCESS) {
      status = check(cudaStreamWaitEvent(cu(waiter), e, 0), "cudaStreamWaitEvent");
    }
    if (e != nullptr) cudaEventDestroy(e);  // the wait captured the record already
    return status;
  }

  void* foreign_allocate(size_t bytes) override {
    void* p = nullptr;
    if (check(cudaMallocAsync(&p, bytes, cudaStreamLegacy), "cudaMallocAsync") !=
            ARCPOOL_STATUS_SUCCESS ||
        check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize") !=
            ARCPOOL_STATUS_SUCCESS) {
      return nullptr;
    }
    return p;
  }

  uint64_t mismatches() override { return read().mismatches; }
  uint64_t verified_words() override { return read().words; }

 protected:
  // on_free runs once every fence completed, never in a host callback: a stream-ordered free
  // on the legacy stream is safe and blocks no one of ours (they are non-blocking).
  void release_foreign(void* pointer, size_t) override {
    check(cudaFreeAsync(pointer, cudaStreamLegacy), "cudaFreeAsync");
  }

 private:
  verify_counters read() {
    verify_counters host{0, 0, 0};
    if (counters_ != nullptr) {
      check(cudaMemcpy(&host, counters_, sizeof(host), cudaMemcpyDeviceToHost), "read counters");
    }
    return host;
  }

  verify_counters* counters_ = nullptr;
};

}  // namespace

std::unique_ptr<workload> make_cuda_workload() {
  return std::make_unique<cuda_workload>();
}

}  // namespace arcpool::kernels
