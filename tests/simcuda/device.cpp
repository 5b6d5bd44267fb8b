// Devices, errors, and the driver entry points reached through the runtime (stream memory
// operations on mapped page-locked memory).
#include <cuda.h>

#include <chrono>
#include <utility>

#include "state.hpp"

namespace simcuda {
namespace {

struct error_name {
  cudaError_t code;
  const char* name;
  const char* text;
};

#define SIMCUDA_ERROR(code, text) \
  { code, #code, text }
const error_name kErrors[] = {
    SIMCUDA_ERROR(cudaSuccess, "no error"),
    SIMCUDA_ERROR(cudaErrorInvalidValue, "invalid argument"),
    SIMCUDA_ERROR(cudaErrorMemoryAllocation, "out of memory"),
    SIMCUDA_ERROR(cudaErrorInitializationError, "initialization error"),
    SIMCUDA_ERROR(cudaErrorCudartUnloading, "driver shutting down"),
    SIMCUDA_ERROR(cudaErrorInvalidConfiguration, "invalid configuration argument"),
    SIMCUDA_ERROR(cudaErrorMissingConfiguration, "__global__ function call is not configured"),
    SIMCUDA_ERROR(cudaErrorInsufficientDriver,
                  "CUDA driver version is insufficient for CUDA runtime version"),
    SIMCUDA_ERROR(cudaErrorNoDevice, "no CUDA-capable device is detected"),
    SIMCUDA_ERROR(cudaErrorInvalidDevice, "invalid device ordinal"),
    SIMCUDA_ERROR(cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable"),
    SIMCUDA_ERROR(cudaErrorInvalidDeviceFunction, "invalid device function"),
    SIMCUDA_ERROR(cudaErrorInvalidResourceHandle, "invalid resource handle"),
    SIMCUDA_ERROR(cudaErrorIllegalState, "the operation cannot be performed in the present state"),
    SIMCUDA_ERROR(cudaErrorSymbolNotFound, "named symbol not found"),
    SIMCUDA_ERROR(cudaErrorNotReady, "device not ready"),
    SIMCUDA_ERROR(cudaErrorIllegalAddress, "an illegal memory access was encountered"),
    SIMCUDA_ERROR(cudaErrorNotSupported, "operation not supported"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureUnsupported,
                  "operation not permitted when stream is capturing"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureInvalidated,
                  "operation failed due to a previous error during capture"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureMerge,
                  "operation would result in a merge of separate "
                  "capture sequences"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureUnmatched,
                  "capture was not ended in the same stream as it "
                  "began"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureUnjoined, "capturing stream has unjoined work"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureIsolation,
                  "dependency created on uncaptured work in "
                  "another stream"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureImplicit,
                  "operation would make the legacy stream depend on a capturing blocking stream"),
    SIMCUDA_ERROR(cudaErrorCapturedEvent,
                  "operation not permitted on an event last recorded in a capturing stream"),
    SIMCUDA_ERROR(cudaErrorStreamCaptureWrongThread,
                  "attempt to terminate a thread-local capture "
                  "sequence from another thread"),
    SIMCUDA_ERROR(cudaErrorUnknown, "unknown error"),
};
#undef SIMCUDA_ERROR

const error_name* find_error(cudaError_t e) {
  for (const error_name& n : kErrors)
    if (n.code == e) return &n;
  return nullptr;
}

CUresult stream_memory_op(CUstream stream, CUdeviceptr address, cuuint32_t value, unsigned flags,
                          bool wait) {
  const char* call = wait ? "cuStreamWaitValue32" : "cuStreamWriteValue32";
  runtime& r = rt();
  std::unique_lock<std::mutex> lock(r.mu);
  if (enter(call) != cudaSuccess) return CUDA_ERROR_ILLEGAL_ADDRESS;
  stream_obj* s = resolve_stream(reinterpret_cast<cudaStream_t>(stream), false, call);
  if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  cudaError_t e = cudaSuccess;
  if (capture_node(*s, call, &e)) return e == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  const auto p = static_cast<uintptr_t>(address);
  auto* word = static_cast<uint32_t*>(alias_of(p));
  auto o = std::make_unique<op>();
  o->what = format("%s(0x%llx, %u)", call, static_cast<unsigned long long>(p), value);
  o->watches = p;
  if (wait) {
    // cuStreamWaitValue32: "Enqueues a synchronization of the stream on the given memory
    // location. Work ordered after the operation will block until the given condition on the
    // memory is satisfied."
    const unsigned condition = flags & 0x3u;
    auto met = [word, value, condition] {
      const uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
      return condition == CU_STREAM_WAIT_VALUE_GEQ   ? static_cast<int32_t>(v - value) >= 0
             : condition == CU_STREAM_WAIT_VALUE_EQ  ? v == value
             : condition == CU_STREAM_WAIT_VALUE_AND ? (v & value) != 0
                                                     : ~(v | value) != 0;
    };
    o->run = [met] {
      while (!met())
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    };
    o->held = [met] { return !met(); };
  } else {
    o->run = [word, value] { __atomic_store_n(word, value, __ATOMIC_RELEASE); };
  }
  enqueue(*s, std::move(o));
  return CUDA_SUCCESS;
}

CUresult CUDAAPI wait_value32(CUstream s, CUdeviceptr address, cuuint32_t value, unsigned flags) {
  return stream_memory_op(s, address, value, flags, true);
}

CUresult CUDAAPI write_value32(CUstream s, CUdeviceptr address, cuuint32_t value, unsigned flags) {
  return stream_memory_op(s, address, value, flags, false);
}

/// The CUresult of a sticky runtime error: the same fault under the driver API's name.
CUresult sticky_result(cudaError_t sticky) {
  return sticky == cudaErrorIllegalAddress ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_UNKNOWN;
}

/// Counts a call of a driver entry point (cuCtxGetCurrent, cuCtxSetCurrent, ...) and returns its
/// result before it acts. Each of them "may also return error codes from previous, asynchronous
/// launches" (cuda.h's \notefnerr on every one): a sticky fault is returned, as the runtime's
/// calls return it. Their other documented failures: an unloaded driver (simcuda_unload_driver)
/// answers CUDA_ERROR_DEINITIALIZED, and so does a fault injected as cudaErrorCudartUnloading;
/// any other injected fault answers CUDA_ERROR_NOT_INITIALIZED. With the lock.
CUresult context_call_result(const char* name) {
  runtime& r = rt();
  const cudaError_t sticky = std::exchange(r.sticky, cudaSuccess);
  const cudaError_t e = enter(name);
  r.sticky = sticky;
  if (e == cudaSuccess) return sticky == cudaSuccess ? CUDA_SUCCESS : sticky_result(sticky);
  return e == cudaErrorCudartUnloading ? CUDA_ERROR_DEINITIALIZED : CUDA_ERROR_NOT_INITIALIZED;
}

// cuGetErrorName: "Sets *pStr to the address of a NULL-terminated string representation of the
// name of the enum error code error. If the error code is not recognized,
// CUDA_ERROR_INVALID_VALUE will be returned and *pStr will be set to the NULL address." The
// codes simcuda's driver entry points return.
CUresult CUDAAPI get_error_name(CUresult error, const char** out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS:
      *out = "CUDA_SUCCESS";
      return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_VALUE:
      *out = "CUDA_ERROR_INVALID_VALUE";
      return CUDA_SUCCESS;
    case CUDA_ERROR_NOT_INITIALIZED:
      *out = "CUDA_ERROR_NOT_INITIALIZED";
      return CUDA_SUCCESS;
    case CUDA_ERROR_DEINITIALIZED:
      *out = "CUDA_ERROR_DEINITIALIZED";
      return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_CONTEXT:
      *out = "CUDA_ERROR_INVALID_CONTEXT";
      return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_DEVICE:
      *out = "CUDA_ERROR_INVALID_DEVICE";
      return CUDA_SUCCESS;
    case CUDA_ERROR_INVALID_HANDLE:
      *out = "CUDA_ERROR_INVALID_HANDLE";
      return CUDA_SUCCESS;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      *out = "CUDA_ERROR_ILLEGAL_ADDRESS";
      return CUDA_SUCCESS;
    case CUDA_ERROR_UNKNOWN:
      *out = "CUDA_ERROR_UNKNOWN";
      return CUDA_SUCCESS;
    default:
      *out = nullptr;
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// cuCtxGetCurrent: "Returns in *pctx the CUDA context bound to the calling CPU thread. If no
// context is bound to the calling CPU thread then *pctx is set to NULL and CUDA_SUCCESS is
// returned." A primary context's handle is its device_obj.
CUresult CUDAAPI ctx_get_current(CUcontext* out) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuCtxGetCurrent"); e != CUDA_SUCCESS) return e;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const thread_state& t = ts();
  if (!t.context_current) {
    *out = nullptr;
  } else if (t.created_context != 0) {
    *out = reinterpret_cast<CUcontext>(t.created_context);
  } else {
    *out = reinterpret_cast<CUcontext>(r.devices[t.device].get());
  }
  return CUDA_SUCCESS;
}

// cuCtxSetCurrent: "Binds the specified CUDA context to the calling CPU thread. If ctx is NULL
// then this will be equivalent to popping the top of the calling CPU thread's CUDA context
// stack (or a no-op if the calling CPU thread's CUDA context stack is empty)." simcuda models
// primary contexts only, and a stack of at most one.
CUresult CUDAAPI ctx_set_current(CUcontext ctx) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuCtxSetCurrent"); e != CUDA_SUCCESS) return e;
  thread_state& t = ts();
  if (ctx == nullptr) {
    t.context_current = false;
    t.created_context = 0;
    t.device = t.selected;  // the runtime's own device, as the next implicit context takes it
    return CUDA_SUCCESS;
  }
  for (const std::unique_ptr<device_obj>& d : r.devices) {
    if (reinterpret_cast<CUcontext>(d.get()) == ctx && d->context) {
      t.device = d->ordinal;
      t.context_current = true;
      t.created_context = 0;
      return CUDA_SUCCESS;
    }
  }
  if (auto it = r.created_contexts.find(reinterpret_cast<uintptr_t>(ctx));
      it != r.created_contexts.end()) {
    t.device = it->second;
    t.context_current = true;
    t.created_context = it->first;
    return CUDA_SUCCESS;
  }
  violation(format("cuCtxSetCurrent: %p is not an initialized context", static_cast<void*>(ctx)));
  return CUDA_ERROR_INVALID_CONTEXT;
}

// cuDeviceGet: "Returns in *device a device handle given an ordinal in the range
// [0, cuDeviceGetCount()-1]." simcuda's handle is the ordinal.
CUresult CUDAAPI device_get(CUdevice* out, int ordinal) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuDeviceGet"); e != CUDA_SUCCESS) return e;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (device_at(ordinal) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *out = ordinal;
  return CUDA_SUCCESS;
}

// cuDevicePrimaryCtxRetain: "Retains the primary context on the device. Once the user
// successfully retains the primary context, the primary context will be active and available to
// the user until the user releases it with cuDevicePrimaryCtxRelease() [...]. Unlike
// cuCtxCreate() the newly created context is not pushed onto the stack." It changes no thread's
// current context.
CUresult CUDAAPI primary_ctx_retain(CUcontext* out, CUdevice dev) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuDevicePrimaryCtxRetain"); e != CUDA_SUCCESS)
    return e;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  device_obj* d = device_at(dev);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  ensure_context(*d);
  ++d->primary_retains;
  *out = reinterpret_cast<CUcontext>(d);
  return CUDA_SUCCESS;
}

// cuDevicePrimaryCtxRelease: "Releases the primary context interop on the device. A retained
// context should always be released once the user is done using it." A release without a
// retain is a violation (the runtime's own retain would be the one given back).
CUresult CUDAAPI primary_ctx_release(CUdevice dev) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuDevicePrimaryCtxRelease"); e != CUDA_SUCCESS)
    return e;
  device_obj* d = device_at(dev);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (d->primary_retains == 0) {
    violation(format("cuDevicePrimaryCtxRelease(%d) without a retain of its own", dev));
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  --d->primary_retains;
  return CUDA_SUCCESS;
}

// cuCtxCreate (CUDA 13's, cuCtxCreate_v4): "Creates a new CUDA context and associates it with
// the calling thread. [...] If a context is already current to the thread, it is supplanted by
// the newly created context". simcuda models neither execution affinity nor CIG parameters nor
// the flags: such a context is another context of the device, whose streams and events are its
// own (cudaEventRecord refuses an event and a stream of different contexts).
CUresult CUDAAPI ctx_create(CUcontext* out, CUctxCreateParams* params, unsigned int flags,
                            CUdevice dev) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuCtxCreate"); e != CUDA_SUCCESS) return e;
  (void)flags;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr &&
      (params->execAffinityParams != nullptr || params->cigParams != nullptr)) {
    unverified("cuCtxCreate with execution affinity or CIG parameters: not modeled, ignored");
  }
  device_obj* d = device_at(dev);
  if (d == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  ensure_context(*d);  // the device's runtime state (pools, default streams) lives there
  const uintptr_t handle = new_handle();
  r.created_contexts.emplace(handle, d->ordinal);
  thread_state& t = ts();
  t.device = d->ordinal;
  t.context_current = true;
  t.created_context = handle;
  *out = reinterpret_cast<CUcontext>(handle);
  return CUDA_SUCCESS;
}

// cuCtxDestroy: "If ctx is current to the calling thread then ctx will also be popped from the
// current thread's context stack". Its streams and events are not destroyed with it here: using
// them afterwards is undefined behaviour that simcuda does not report.
CUresult CUDAAPI ctx_destroy(CUcontext ctx) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuCtxDestroy"); e != CUDA_SUCCESS) return e;
  if (r.created_contexts.erase(reinterpret_cast<uintptr_t>(ctx)) == 0) {
    return CUDA_ERROR_INVALID_CONTEXT;  // primary contexts are released, never destroyed
  }
  thread_state& t = ts();
  if (t.context_current && t.created_context == reinterpret_cast<uintptr_t>(ctx)) {
    t.context_current = false;
    t.created_context = 0;
    t.device = t.selected;
  }
  return CUDA_SUCCESS;
}

// cuStreamGetCtx: "Returns the CUDA context that the stream is associated with. [...] The
// returned context is the context that was active in the calling thread when the stream was
// created. [...] Specifying any of the special handles will return the context current to the
// calling thread. If no context is current to the calling thread, CUDA_ERROR_INVALID_CONTEXT is
// returned."
CUresult CUDAAPI stream_get_ctx(CUstream handle, CUcontext* out) {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (const CUresult e = context_call_result("cuStreamGetCtx"); e != CUDA_SUCCESS) return e;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto h = reinterpret_cast<uintptr_t>(handle);
  if (h == 0 || h == reinterpret_cast<uintptr_t>(cudaStreamLegacy) ||
      h == reinterpret_cast<uintptr_t>(cudaStreamPerThread)) {
    const thread_state& t = ts();
    if (!t.context_current) return CUDA_ERROR_INVALID_CONTEXT;
    *out = t.created_context != 0 ? reinterpret_cast<CUcontext>(t.created_context)
                                  : reinterpret_cast<CUcontext>(r.devices[t.device].get());
    return CUDA_SUCCESS;
  }
  auto it = r.streams.find(h);
  if (it == r.streams.end() || it->second->destroyed) {
    violation(format("cuStreamGetCtx: %p is not a live stream (undefined behaviour)",
                     static_cast<void*>(handle)));
    return CUDA_ERROR_INVALID_HANDLE;
  }
  *out = reinterpret_cast<CUcontext>(it->second->context);
  return CUDA_SUCCESS;
}

cudaError_t driver_entry_point(const char* symbol, void** fn, unsigned version,
                               unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  SIMCUDA_ENTER("cudaGetDriverEntryPointByVersion");
  (void)flags;
  if (symbol == nullptr || fn == nullptr) return ret(cudaErrorInvalidValue);
  *fn = nullptr;
  if (std::string(symbol) == "cuStreamWaitValue32") *fn = reinterpret_cast<void*>(wait_value32);
  if (std::string(symbol) == "cuStreamWriteValue32") *fn = reinterpret_cast<void*>(write_value32);
  if (std::string(symbol) == "cuCtxGetCurrent") *fn = reinterpret_cast<void*>(ctx_get_current);
  if (std::string(symbol) == "cuCtxSetCurrent") *fn = reinterpret_cast<void*>(ctx_set_current);
  if (std::string(symbol) == "cuDeviceGet") *fn = reinterpret_cast<void*>(device_get);
  if (std::string(symbol) == "cuStreamGetCtx") *fn = reinterpret_cast<void*>(stream_get_ctx);
  if (std::string(symbol) == "cuCtxDestroy") *fn = reinterpret_cast<void*>(ctx_destroy);
  if (std::string(symbol) == "cuGetErrorName") *fn = reinterpret_cast<void*>(get_error_name);
  if (std::string(symbol) == "cuCtxCreate") {
    // The signature depends on the version asked for: CUDA 13's (v4) from 13000 on.
    if (version >= 13000) {
      *fn = reinterpret_cast<void*>(ctx_create);
    } else {
      unverified(
          format("cuCtxCreate for version %u: only CUDA 13's signature is modeled", version));
    }
  }
  if (std::string(symbol) == "cuDevicePrimaryCtxRetain") {
    *fn = reinterpret_cast<void*>(primary_ctx_retain);
  }
  if (std::string(symbol) == "cuDevicePrimaryCtxRelease") {
    *fn = reinterpret_cast<void*>(primary_ctx_release);
  }
  if (status != nullptr) {
    *status = *fn != nullptr ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  }
  if (*fn == nullptr) unverified(format("driver entry point %s is not modeled", symbol));
  return cudaSuccess;
}

}  // namespace
}  // namespace simcuda

using namespace simcuda;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  SIMCUDA_ENTER("cudaGetDeviceCount");
  if (count == nullptr) return ret(cudaErrorInvalidValue);
  *count = static_cast<int>(r.devices.size());
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  SIMCUDA_ENTER("cudaSetDevice");
  device_obj* d = device_at(device);
  if (d == nullptr) return ret(cudaErrorInvalidDevice);
  // cudaSetDevice: "This function will also immediately initialize the runtime state on the
  // primary context, and the context will be current on device immediately."
  ensure_context(*d);
  ts().device = device;
  ts().selected = device;
  ts().context_current = true;
  ts().created_context = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  SIMCUDA_ENTER("cudaGetDevice");
  if (device == nullptr) return ret(cudaErrorInvalidValue);
  *device = ts().device;  // the current context's device, or 0; creates no context
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  SIMCUDA_ENTER("cudaDeviceGetAttribute");
  if (value == nullptr) return ret(cudaErrorInvalidValue);
  if (device_at(device) == nullptr) return ret(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      break;
    case cudaDevAttrMemoryPoolsSupported:
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrCanMapHostMemory:
      *value = 1;
      break;
    case cudaDevAttrMemoryPoolSupportedHandleTypes:
      *value = cudaMemHandleTypePosixFileDescriptor;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMaxThreadsPerBlock:
    case cudaDevAttrMaxBlockDimX:
      *value = 1024;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = 48 << 10;
      break;
    case cudaDevAttrMaxGridDimX:
      *value = 0x7fffffff;
      break;
    default:
      unverified(format("device attribute %d is not modeled; answering 0", static_cast<int>(attr)));
      *value = 0;
  }
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  thread_state& t = ts();
  const cudaError_t e = t.last_error;
  std::lock_guard<std::mutex> lock(rt().mu);
  ++rt().calls["cudaGetLastError"];
  t.last_error = rt().sticky;  // a sticky error is never reset
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  std::lock_guard<std::mutex> lock(rt().mu);
  ++rt().calls["cudaPeekAtLastError"];
  return ts().last_error;
}

const char* cudaGetErrorName(cudaError_t e) {
  const error_name* n = find_error(e);
  return n != nullptr ? n->name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  const error_name* n = find_error(e);
  return n != nullptr ? n->text : "unrecognized error code";
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                             unsigned long long flags,
                                             cudaDriverEntryPointQueryResult* status) {
  return driver_entry_point(symbol, fn, version, flags, status);
}

cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** fn,
                                                  unsigned int version, unsigned long long flags,
                                                  cudaDriverEntryPointQueryResult* status) {
  return driver_entry_point(symbol, fn, version, flags, status);
}

}  // extern "C"
