// The CUDA driver's runtime-call helpers (cuda_calls.hpp).
#include "drivers/cuda_calls.hpp"

#include "support/process_exit.hpp"
#include "support/status.hpp"

namespace arcpool::detail::cuda {

arcpool_status_t check_failed(cudaError_t e, const char* what) {
  cudaGetLastError();
  if (e == cudaErrorCudartUnloading) mark_process_exiting();
  arcpool_status_t status = ARCPOOL_STATUS_CUDA_ERROR;
  if (e == cudaErrorMemoryAllocation) status = ARCPOOL_STATUS_OUT_OF_MEMORY;
  if (e == cudaErrorStreamCaptureUnsupported || e == cudaErrorStreamCaptureInvalidated ||
      e == cudaErrorStreamCaptureImplicit || e == cudaErrorCapturedEvent ||
      e == cudaErrorStreamCaptureWrongThread || e == cudaErrorStreamCaptureIsolation ||
      e == cudaErrorStreamCaptureMerge || e == cudaErrorStreamCaptureUnmatched ||
      e == cudaErrorStreamCaptureUnjoined) {
    status = ARCPOOL_STATUS_UNSUPPORTED;
  }
  return fail(status, "%s failed: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

void discard_failed(cudaError_t e) {
  cudaGetLastError();
  if (e == cudaErrorCudartUnloading) mark_process_exiting();
}

const context_functions& context_api() {
  static const context_functions api = [] {
    context_functions f;
    // A failed lookup sets this thread's last error: that one is cleared, and only that one,
    // so that an application error nobody has read yet survives arcpool's first call.
    auto lookup = [](const char* symbol) -> void* {
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      void* fn = nullptr;
      const cudaError_t e =
          cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &found);
      if (e != cudaSuccess) cudaGetLastError();
      return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? fn : nullptr;
    };
    f.get_current = reinterpret_cast<decltype(f.get_current)>(lookup("cuCtxGetCurrent"));
    f.set_current = reinterpret_cast<decltype(f.set_current)>(lookup("cuCtxSetCurrent"));
    f.device_get = reinterpret_cast<decltype(f.device_get)>(lookup("cuDeviceGet"));
    f.primary_retain =
        reinterpret_cast<decltype(f.primary_retain)>(lookup("cuDevicePrimaryCtxRetain"));
    f.primary_release =
        reinterpret_cast<decltype(f.primary_release)>(lookup("cuDevicePrimaryCtxRelease"));
    f.stream_get_context =
        reinterpret_cast<decltype(f.stream_get_context)>(lookup("cuStreamGetCtx"));
    f.get_error_name = reinterpret_cast<decltype(f.get_error_name)>(lookup("cuGetErrorName"));
    return f;
  }();
  return api;
}

const char* cu_error_name(CUresult r) {
  const context_functions& api = context_api();
  const char* name = nullptr;
  // cuGetErrorName: an unrecognized code gives CUDA_ERROR_INVALID_VALUE and a null name.
  if (api.get_error_name == nullptr || api.get_error_name(r, &name) != CUDA_SUCCESS ||
      name == nullptr) {
    return "an unnamed CUresult";
  }
  return name;
}

primary_context::primary_context(int device) {
  const context_functions& api = context_api();
  if (!api.complete()) {
    status_ = fail(ARCPOOL_STATUS_CUDA_ERROR,
                   "the runtime gives no cuCtxGetCurrent / cuCtxSetCurrent / cuDeviceGet / "
                   "cuDevicePrimaryCtxRetain / cuDevicePrimaryCtxRelease / cuStreamGetCtx "
                   "entry point");
    return;
  }
  if (const CUresult r = api.device_get(&device_, device); r != CUDA_SUCCESS) {
    status_ = fail(ARCPOOL_STATUS_CUDA_ERROR, "cuDeviceGet(%d) failed: CUresult %d (%s)", device,
                   static_cast<int>(r), cu_error_name(r));
    return;
  }
  if (const CUresult r = api.primary_retain(&context_, device_); r != CUDA_SUCCESS) {
    context_ = nullptr;
    status_ =
        fail(ARCPOOL_STATUS_CUDA_ERROR, "cuDevicePrimaryCtxRetain(%d) failed: CUresult %d (%s)",
             device, static_cast<int>(r), cu_error_name(r));
  }
}

primary_context::~primary_context() {
  if (context_ != nullptr && !process_exiting()) context_api().primary_release(device_);
}

arcpool_status_t context_call_failed(CUresult r, int device, bool switching) {
  const bool shutting_down = r == CUDA_ERROR_DEINITIALIZED;
  if (shutting_down) mark_process_exiting();
  const char* why = shutting_down ? ": the CUDA driver is shutting down" : "";
  if (switching) {
    return fail(ARCPOOL_STATUS_CUDA_ERROR,
                "cannot switch to device %d: cuCtxSetCurrent failed: CUresult %d (%s)%s", device,
                static_cast<int>(r), cu_error_name(r), why);
  }
  return fail(ARCPOOL_STATUS_CUDA_ERROR, "cuCtxGetCurrent failed: CUresult %d (%s)%s",
              static_cast<int>(r), cu_error_name(r), why);
}

arcpool_status_t exiting(const char* what) {
  return fail(ARCPOOL_STATUS_CUDA_ERROR, "%s skipped: the process is exiting", what);
}

std::mutex& graph_calls_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace arcpool::detail::cuda
