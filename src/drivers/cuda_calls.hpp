// The CUDA driver's runtime-call helpers (cuda_driver.cpp, cuda_pools.cpp): CUDA results as
// statuses, the driver API's context functions reached through the runtime, the device guard
// that makes an allocator's device current for a call, and the relaxed capture mode.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "arcpool/arcpool.h"
#include "drivers/driver.hpp"
#include "support/status.hpp"

namespace arcpool::detail::cuda {

/// check()'s failure: the status of a failed call `what`, with its message.
arcpool_status_t check_failed(cudaError_t e, const char* what);

/// Maps a CUDA result to a status, naming the call and the CUDA error; clears the runtime's
/// per-thread last error so the application's own checks do not see ours.
inline arcpool_status_t check(cudaError_t e, const char* what) {
  return e == cudaSuccess ? ARCPOOL_STATUS_SUCCESS : check_failed(e, what);
}

/// discard()'s failure: clears it from the thread's last error.
void discard_failed(cudaError_t e);

/// A call whose failure arcpool cannot act on (destroying, releasing, restoring): its error is
/// arcpool's, so it is cleared from the thread's last error, and an unloading runtime marks the
/// process as exiting, as check() does.
inline void discard(cudaError_t e) {
  if (e != cudaSuccess) discard_failed(e);
}

/// The driver API's context functions, reached through the runtime
/// (cudaGetDriverEntryPointByVersion), so that arcpool links no libcuda. Null members when the
/// runtime does not provide them.
struct context_functions {
  CUresult(CUDAAPI* get_current)(CUcontext*) = nullptr;
  CUresult(CUDAAPI* set_current)(CUcontext) = nullptr;
  CUresult(CUDAAPI* device_get)(CUdevice*, int) = nullptr;
  CUresult(CUDAAPI* primary_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult(CUDAAPI* primary_release)(CUdevice) = nullptr;
  CUresult(CUDAAPI* stream_get_context)(CUstream, CUcontext*) = nullptr;
  /// cuGetErrorName, for messages only: not required by complete().
  CUresult(CUDAAPI* get_error_name)(CUresult, const char**) = nullptr;

  /// Whether the runtime gave every one of them.
  bool complete() const noexcept {
    return get_current != nullptr && set_current != nullptr && device_get != nullptr &&
           primary_retain != nullptr && primary_release != nullptr && stream_get_context != nullptr;
  }
};

/// The context functions, looked up once per process.
const context_functions& context_api();

/// `r`'s name ("CUDA_ERROR_ILLEGAL_ADDRESS"), for messages: "an unnamed CUresult" when the
/// driver names none. A context call may also return "error codes from previous, asynchronous
/// launches" (cuCtxSetCurrent, cuStreamGetCtx: CUDA Driver API reference), a sticky fault
/// among them, which the message must name.
const char* cu_error_name(CUresult r);

/// One retain of a device's primary context (cuDevicePrimaryCtxRetain), held for an
/// allocator's life and given back when it ends, unless the process is exiting. The retain makes
/// no context current and leaves the runtime's own per-thread device alone.
class primary_context {
 public:
  /// Retains `device`'s primary context; a failure is status(), with a message.
  explicit primary_context(int device);
  /// Gives the retain back, unless the process is exiting.
  ~primary_context();
  primary_context(const primary_context&) = delete;
  primary_context& operator=(const primary_context&) = delete;

  /// SUCCESS once retained.
  arcpool_status_t status() const noexcept { return status_; }
  /// The context (null when the retain failed).
  CUcontext get() const noexcept { return context_; }

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  arcpool_status_t status_ = ARCPOOL_STATUS_SUCCESS;
};

/// device_guard's failure: the status of a failed cuCtxGetCurrent, or (`switching`) of a failed
/// cuCtxSetCurrent to `device`'s context. CUDA_ERROR_DEINITIALIZED, "the CUDA driver is in the
/// process of shutting down" (cuda.h), marks the process as exiting, as cudaErrorCudartUnloading
/// does in check(): no later call of arcpool's calls CUDA (design.md §10, "Exit").
arcpool_status_t context_call_failed(CUresult r, int device, bool switching);

/// Makes `device`'s primary context (`primary`, retained by the driver) current for the scope,
/// then puts back the context that was current before, or none when none was (design.md §6,
/// "Devices and contexts"). Runtime calls "operate on the CUDA Driver API CUcontext which is
/// current to the calling host thread" (CUDA Runtime API, "Interactions with the CUDA Driver
/// API"). The switch is cuCtxSetCurrent alone, never cudaSetDevice: cudaSetDevice also sets the
/// runtime's own per-thread device, which the application's next call on a thread with no
/// current context would then use (NVIDIA's DALI switches the same way: NVIDIA/DALI PR 6327).
/// When `primary` is current already, the guard makes one call, cuCtxGetCurrent. A switch that
/// fails is the guard's status(): the caller returns it and makes no call on another device.
class device_guard {
 public:
  device_guard(int device, CUcontext primary) {
    const context_functions& api = context_api();
    if (const CUresult r = api.get_current(&previous_); r != CUDA_SUCCESS) {
      status_ = context_call_failed(r, device, /*switching=*/false);
      return;
    }
    if (previous_ == primary) return;
    if (const CUresult r = api.set_current(primary); r != CUDA_SUCCESS) {
      status_ = context_call_failed(r, device, /*switching=*/true);
      return;
    }
    restore_ = true;
  }
  ~device_guard() {
    // Null restores "no context": cuCtxSetCurrent(NULL) pops the context the guard bound.
    if (restore_) context_api().set_current(previous_);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

  /// SUCCESS once the device's context is current.
  arcpool_status_t status() const noexcept { return status_; }

 private:
  CUcontext previous_ = nullptr;
  bool restore_ = false;
  arcpool_status_t status_ = ARCPOOL_STATUS_SUCCESS;
};

/// Relaxed stream-capture mode for the scope. Queries and synchronizations are "potentially
/// unsafe" calls: in the default (global) mode they would fail, and invalidate the capture,
/// while any thread captures a graph. arcpool's own calls never touch a capturing stream. Pool
/// calls (create, destroy, attributes, trim) run relaxed too: the Runtime API does not list
/// them, but NVIDIA's CCCL does the same because "reading or writing a pool attribute is refused
/// while the calling thread is capturing" (NVIDIA/cccl PR 11360). So do allocations and frees
/// in a pool, and pool exports and imports: on an H200 (CUDA 13.0, driver 580.159.04;
/// bench/results/2026-12-04-h200), cudaMallocFromPoolAsync on a stream that is not capturing,
/// and cudaMemPoolExportPointer, failed with cudaErrorStreamCaptureUnsupported and invalidated
/// the capture in global or thread-local mode (the conformance suite's Capture tests).
/// A failed exchange changes nothing, and nothing is restored then.
class relaxed_capture_guard {
 public:
  relaxed_capture_guard() {
    const cudaError_t e = cudaThreadExchangeStreamCaptureMode(&previous_);
    exchanged_ = e == cudaSuccess;
    discard(e);
  }
  ~relaxed_capture_guard() {
    if (exchanged_) discard(cudaThreadExchangeStreamCaptureMode(&previous_));
  }
  relaxed_capture_guard(const relaxed_capture_guard&) = delete;
  relaxed_capture_guard& operator=(const relaxed_capture_guard&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
  bool exchanged_ = false;
};

/// The status of a call `what` skipped because the process is exiting.
arcpool_status_t exiting(const char* what);

/// A stream handle as the runtime's stream.
inline cudaStream_t cu(stream_handle s) {
  return reinterpret_cast<cudaStream_t>(s);
}
/// An event handle as the runtime's event.
inline cudaEvent_t cu(event_handle e) {
  return static_cast<cudaEvent_t>(e);
}

/// Serializes arcpool's calls on capture graphs. "Graph objects (cudaGraph_t, CUgraph) are not
/// internally synchronized and must not be accessed concurrently from multiple threads. API
/// calls accessing the same graph object must be serialized externally" (Driver API, "Graph
/// object thread safety"): two threads freeing on two streams of one capture reach its one
/// graph. Process-wide, since allocators of several devices may free into one capture.
std::mutex& graph_calls_mutex();

}  // namespace arcpool::detail::cuda
