// The CUDA driver: the product. Streams, timing-disabled events, a cudaMemPool_t (owned with
// arcpool's settings, or adopted) and host functions, each call on the allocator's device. Its
// runtime-call helpers are cuda_calls.hpp, the owned pool's setup cuda_pools.cpp.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "drivers/cuda_calls.hpp"
#include "drivers/cuda_pools.hpp"
#include "drivers/driver.hpp"
#include "support/process_exit.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

using cuda::check;
using cuda::context_api;
using cuda::cu;
using cuda::device_guard;
using cuda::discard;
using cuda::exiting;
using cuda::primary_context;
using cuda::relaxed_capture_guard;

/// The driver of one device: its primary context, its pool, and each call made on the device.
class cuda_driver final : public driver {
 public:
  cuda_driver(int device, std::unique_ptr<primary_context> context, cudaMemPool_t pool, bool owned,
              uint32_t handle_types)
      : device_(device),
        context_(std::move(context)),
        primary_(context_->get()),
        pool_(pool),
        owned_(owned),
        handle_types_(handle_types) {}

  ~cuda_driver() override {
    if (owned_ && !process_exiting()) {
      device_guard guard(device_, primary_);
      if (guard.status() != ARCPOOL_STATUS_SUCCESS) return;  // the pool goes with the process
      relaxed_capture_guard relaxed;
      discard(cudaMemPoolDestroy(pool_));  // returns at once; released once its memory is freed
    }
  }

  arcpool_driver_kind_t kind() const noexcept override { return ARCPOOL_DRIVER_CUDA; }
  int device() const noexcept override { return device_; }

  arcpool_status_t stream_create(stream_handle* out) override {
    if (process_exiting()) return exiting("cudaStreamCreateWithFlags");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    cudaStream_t s = nullptr;
    ARCPOOL_RETURN_IF_ERROR(
        check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    *out = reinterpret_cast<stream_handle>(s);
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_destroy(stream_handle s) override {
    if (process_exiting()) return ARCPOOL_STATUS_SUCCESS;
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    return check(cudaStreamDestroy(cu(s)), "cudaStreamDestroy");
  }

  arcpool_status_t stream_synchronize(stream_handle s) override {
    if (process_exiting()) return exiting("cudaStreamSynchronize");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(cudaStreamSynchronize(cu(s)), "cudaStreamSynchronize");
  }

  arcpool_status_t stream_id(stream_handle s, uint64_t* out) override {
    if (process_exiting()) return exiting("cudaStreamGetId");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    unsigned long long id = 0;
    ARCPOOL_RETURN_IF_ERROR(check(cudaStreamGetId(cu(s), &id), "cudaStreamGetId"));
    *out = id;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_device(stream_handle s, int* out, bool* primary_context) override {
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    // cuStreamGetCtx: "the context that was active in the calling thread when the stream was
    // created". The primary context is the common answer, and names the device too.
    CUcontext context = nullptr;
    if (const CUresult r = context_api().stream_get_context(cu(s), &context); r != CUDA_SUCCESS) {
      return fail(ARCPOOL_STATUS_CUDA_ERROR, "cuStreamGetCtx(%p) failed: CUresult %d (%s)",
                  static_cast<void*>(s), static_cast<int>(r), cuda::cu_error_name(r));
    }
    *primary_context = context == primary_;
    if (*primary_context) {
      *out = device_;
      return ARCPOOL_STATUS_SUCCESS;
    }
    return check(cudaStreamGetDevice(cu(s), out), "cudaStreamGetDevice");
  }

  arcpool_status_t stream_is_capturing(stream_handle s, bool* out) override {
    if (process_exiting()) return exiting("cudaStreamIsCapturing");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    ARCPOOL_RETURN_IF_ERROR(check(cudaStreamIsCapturing(cu(s), &status), "cudaStreamIsCapturing"));
    *out = status != cudaStreamCaptureStatusNone;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t stream_begin_capture(stream_handle s) override {
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    return check(cudaStreamBeginCapture(cu(s), cudaStreamCaptureModeThreadLocal),
                 "cudaStreamBeginCapture");
  }

  arcpool_status_t stream_end_capture(stream_handle s) override {
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    cudaGraph_t graph = nullptr;
    const arcpool_status_t status =
        check(cudaStreamEndCapture(cu(s), &graph), "cudaStreamEndCapture");
    if (graph != nullptr) discard(cudaGraphDestroy(graph));
    return status;
  }

  bool supports_graphs() const noexcept override { return true; }

  arcpool_status_t stream_capture_info(stream_handle s, capture_info* out) override {
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
    cudaGraph_t graph = nullptr;
    ARCPOOL_RETURN_IF_ERROR(
        check(cudaStreamGetCaptureInfo(cu(s), &status, &id, &graph, nullptr, nullptr, nullptr),
              "cudaStreamGetCaptureInfo"));
    if (status != cudaStreamCaptureStatusActive || graph == nullptr) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED, "stream %p is not in an active capture (status %d)",
                  static_cast<void*>(s), static_cast<int>(status));
    }
    out->id = id;
    out->graph = graph;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t graph_defer(void* graph, arcpool_host_fn_t fn, void* user_data) override {
    // cudaUserObjectCreate: the destructor runs when the last reference goes; the graph owns
    // the one reference (cudaGraphUserObjectMove), and instantiations and launches hold theirs
    // (programming guide, "CUDA User Objects"). A trampoline keeps "on failure fn never runs":
    // releasing the object after a failed retain still runs its destructor.
    struct deferred {
      arcpool_host_fn_t fn;
      void* user_data;
      bool armed;
      static void run(void* p) {
        auto* d = static_cast<deferred*>(p);
        if (d->armed) d->fn(d->user_data);
        delete d;
      }
    };
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    auto* d = new (std::nothrow) deferred{fn, user_data, true};
    if (d == nullptr) return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a user object");
    cudaUserObject_t object = nullptr;
    if (arcpool_status_t status = check(
            cudaUserObjectCreate(&object, d, &deferred::run, 1, cudaUserObjectNoDestructorSync),
            "cudaUserObjectCreate");
        status != ARCPOOL_STATUS_SUCCESS) {
      delete d;
      return status;
    }
    cudaError_t retained = cudaSuccess;
    {
      std::lock_guard<std::mutex> lock(cuda::graph_calls_mutex());
      retained = cudaGraphRetainUserObject(static_cast<cudaGraph_t>(graph), object, 1,
                                           cudaGraphUserObjectMove);
    }
    const arcpool_status_t status = check(retained, "cudaGraphRetainUserObject");
    if (status != ARCPOOL_STATUS_SUCCESS) {
      d->armed = false;
      discard(cudaUserObjectRelease(object, 1));
    }
    return status;
  }

  arcpool_status_t launch_host_func(stream_handle s, arcpool_host_fn_t fn,
                                    void* user_data) override {
    if (process_exiting()) return exiting("cudaLaunchHostFunc");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    return check(cudaLaunchHostFunc(cu(s), fn, user_data), "cudaLaunchHostFunc");
  }

  arcpool_status_t event_create(event_handle* out) override {
    if (process_exiting()) return exiting("cudaEventCreateWithFlags");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    cudaEvent_t e = nullptr;
    ARCPOOL_RETURN_IF_ERROR(
        check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
    *out = e;
    return ARCPOOL_STATUS_SUCCESS;
  }

  void event_destroy(event_handle e) noexcept override {
    if (process_exiting()) return;
    device_guard guard(device_, primary_);
    if (guard.status() != ARCPOOL_STATUS_SUCCESS) return;  // unreachable device: the event stays
    discard(cudaEventDestroy(cu(e)));
  }

  arcpool_status_t event_record(event_handle e, stream_handle s) override {
    if (process_exiting()) return exiting("cudaEventRecord");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    return check(cudaEventRecord(cu(e), cu(s)), "cudaEventRecord");
  }

  arcpool_status_t stream_wait_event(stream_handle s, event_handle e) override {
    if (process_exiting()) return exiting("cudaStreamWaitEvent");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    return check(cudaStreamWaitEvent(cu(s), cu(e), 0), "cudaStreamWaitEvent");
  }

  arcpool_status_t event_query(event_handle e, bool* done) override {
    if (process_exiting()) return exiting("cudaEventQuery");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    const cudaError_t r = cudaEventQuery(cu(e));
    if (r == cudaErrorNotReady) {
      // Not an error, but the runtime records it as this thread's last error: clear it, or the
      // application's next cudaGetLastError() (after a kernel launch, say) reports it.
      if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
      *done = false;
      return ARCPOOL_STATUS_SUCCESS;
    }
    ARCPOOL_RETURN_IF_ERROR(check(r, "cudaEventQuery"));
    *done = true;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t event_synchronize(event_handle e) override {
    if (process_exiting()) return exiting("cudaEventSynchronize");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(cudaEventSynchronize(cu(e)), "cudaEventSynchronize");
  }

  arcpool_status_t pool_allocate(size_t bytes, stream_handle s, void** out) override {
    if (process_exiting()) return exiting("cudaMallocFromPoolAsync");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(cudaMallocFromPoolAsync(out, bytes, pool_, cu(s)), "cudaMallocFromPoolAsync");
  }

  arcpool_status_t pool_free(void* p, size_t, stream_handle s) override {
    if (process_exiting()) return ARCPOOL_STATUS_SUCCESS;  // the process gives it all back
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(cudaFreeAsync(p, cu(s)), "cudaFreeAsync");
  }

  arcpool_status_t pool_trim(size_t keep_bytes) override {
    // A pool arcpool borrowed (the device's default or current one) is the application's: its
    // reserve is not arcpool's to give back (arcpool_allocator_trim: "owned pools only").
    if (!owned_) return ARCPOOL_STATUS_SUCCESS;
    if (process_exiting()) return exiting("cudaMemPoolTrimTo");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(cudaMemPoolTrimTo(pool_, keep_bytes), "cudaMemPoolTrimTo");
  }

  pool_figures pool_query() override {
    pool_figures f;
    if (process_exiting()) return f;
    device_guard guard(device_, primary_);
    if (guard.status() != ARCPOOL_STATUS_SUCCESS) return pool_figures{};
    relaxed_capture_guard relaxed;
    uint64_t value = 0;
    bool failed = false;
    auto read = [&](cudaMemPoolAttr attr, uint64_t* out) {
      if (cudaMemPoolGetAttribute(pool_, attr, &value) == cudaSuccess) {
        *out = value;
      } else {
        failed = true;
      }
    };
    read(cudaMemPoolAttrReservedMemCurrent, &f.reserved_current);
    read(cudaMemPoolAttrReservedMemHigh, &f.reserved_peak);
    read(cudaMemPoolAttrUsedMemCurrent, &f.used_current);
    if (failed) cudaGetLastError();  // ours only: never the application's pending error
    return f;
  }

  void pool_reset_peak() noexcept override {
    // A borrowed pool's high-water mark is the application's to reset, as its settings are.
    if (!owned_ || process_exiting()) return;
    device_guard guard(device_, primary_);
    if (guard.status() != ARCPOOL_STATUS_SUCCESS) return;  // nothing to undo
    relaxed_capture_guard relaxed;
    // driver_types.h, cudaMemPoolAttrReservedMemHigh: "High watermark can only be reset to
    // zero"; the pool then restarts it at its current reservation.
    uint64_t zero = 0;
    if (cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero) != cudaSuccess) {
      cudaGetLastError();  // ours: a pool that cannot reset keeps its peak
    }
  }

  arcpool_status_t device_memory(size_t* out) override {
    if (process_exiting()) return exiting("cudaMemGetInfo");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    size_t free_bytes = 0;
    return check(cudaMemGetInfo(&free_bytes, out), "cudaMemGetInfo");
  }

  arcpool_status_t device_synchronize() override {
    if (process_exiting()) return exiting("cudaDeviceSynchronize");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  arcpool_status_t pool_export_fd(int* out) override {
    if (process_exiting()) return exiting("cudaMemPoolExportToShareableHandle");
    // cudaMemPoolExportToShareableHandle: "To create an IPC capable mempool, create a mempool
    // with a CUmemAllocationHandleType other than cudaMemHandleTypeNone." A device's own pools
    // are not: arcpool refuses them before CUDA does.
    if (!owned_) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "device %d's default (or current) pool cannot be exported: create the "
                  "allocator with an owned pool (ARCPOOL_POOL_OWNED) and ipc_handle_types "
                  "including cudaMemHandleTypePosixFileDescriptor",
                  device_);
    }
    if ((handle_types_ & cudaMemHandleTypePosixFileDescriptor) == 0) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "device %d's pool was created with IPC handle types 0x%x, without "
                  "cudaMemHandleTypePosixFileDescriptor (0x%x): it cannot be exported",
                  device_, handle_types_,
                  static_cast<unsigned>(cudaMemHandleTypePosixFileDescriptor));
    }
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(
        cudaMemPoolExportToShareableHandle(out, pool_, cudaMemHandleTypePosixFileDescriptor, 0),
        "cudaMemPoolExportToShareableHandle");
  }

  arcpool_status_t pool_export_pointer(void* p, ipc_pointer_data* out) override {
    if (process_exiting()) return exiting("cudaMemPoolExportPointer");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    cudaMemPoolPtrExportData data{};
    ARCPOOL_RETURN_IF_ERROR(check(cudaMemPoolExportPointer(&data, p), "cudaMemPoolExportPointer"));
    static_assert(sizeof data == sizeof out->bytes, "cudaMemPoolPtrExportData is 64 bytes");
    std::memcpy(out->bytes, &data, sizeof data);
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t ipc_event_create(event_handle* out, ipc_event_data* data) override {
    if (process_exiting()) return exiting("cudaEventCreateWithFlags(Interprocess)");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    // cudaIpcGetEventHandle: the event "must have been created with the cudaEventInterprocess
    // and cudaEventDisableTiming flags set".
    cudaEvent_t e = nullptr;
    ARCPOOL_RETURN_IF_ERROR(
        check(cudaEventCreateWithFlags(&e, cudaEventInterprocess | cudaEventDisableTiming),
              "cudaEventCreateWithFlags(Interprocess)"));
    cudaIpcEventHandle_t handle{};
    if (arcpool_status_t status = check(cudaIpcGetEventHandle(&handle, e), "cudaIpcGetEventHandle");
        status != ARCPOOL_STATUS_SUCCESS) {
      discard(cudaEventDestroy(e));
      return status;
    }
    static_assert(sizeof handle == sizeof data->bytes, "cudaIpcEventHandle_t is 64 bytes");
    std::memcpy(data->bytes, &handle, sizeof handle);
    *out = e;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t ipc_event_open(const ipc_event_data& data, event_handle* out) override {
    if (process_exiting()) return exiting("cudaIpcOpenEventHandle");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    cudaIpcEventHandle_t handle{};
    std::memcpy(&handle, data.bytes, sizeof handle);
    cudaEvent_t e = nullptr;
    ARCPOOL_RETURN_IF_ERROR(check(cudaIpcOpenEventHandle(&e, handle), "cudaIpcOpenEventHandle"));
    *out = e;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t pool_import_fd(int fd, imported_pool* out) override {
    if (process_exiting()) return exiting("cudaMemPoolImportFromShareableHandle");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    // Making a pool and setting its access, as an owned pool's creation does (design.md §8).
    relaxed_capture_guard relaxed;
    cudaMemPool_t pool = nullptr;
    ARCPOOL_RETURN_IF_ERROR(
        check(cudaMemPoolImportFromShareableHandle(&pool, reinterpret_cast<void*>(intptr_t{fd}),
                                                   cudaMemHandleTypePosixFileDescriptor, 0),
              "cudaMemPoolImportFromShareableHandle"));
    if (const arcpool_status_t status = cuda::reach_imported_pool(pool, device_);
        status != ARCPOOL_STATUS_SUCCESS) {
      discard(cudaMemPoolDestroy(pool));
      return status;
    }
    *out = pool;
    return ARCPOOL_STATUS_SUCCESS;
  }

  void imported_pool_destroy(imported_pool pool) noexcept override {
    if (process_exiting()) return;
    device_guard guard(device_, primary_);
    if (guard.status() != ARCPOOL_STATUS_SUCCESS) return;  // the pool goes with the process
    relaxed_capture_guard relaxed;
    discard(cudaMemPoolDestroy(static_cast<cudaMemPool_t>(pool)));
  }

  arcpool_status_t import_pointer(imported_pool pool, const ipc_pointer_data& data,
                                  void** out) override {
    if (process_exiting()) return exiting("cudaMemPoolImportPointer");
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    cudaMemPoolPtrExportData export_data{};
    std::memcpy(&export_data, data.bytes, sizeof export_data);
    return check(cudaMemPoolImportPointer(out, static_cast<cudaMemPool_t>(pool), &export_data),
                 "cudaMemPoolImportPointer");
  }

  arcpool_status_t imported_free(void* p, stream_handle s) override {
    if (process_exiting()) return ARCPOOL_STATUS_SUCCESS;  // the process gives it all back
    device_guard guard(device_, primary_);
    ARCPOOL_RETURN_IF_ERROR(guard.status());
    relaxed_capture_guard relaxed;
    return check(cudaFreeAsync(p, cu(s)), "cudaFreeAsync (imported)");
  }

  void enter_reclaim_thread() noexcept override {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    discard(cudaThreadExchangeStreamCaptureMode(&mode));
    discard(cudaSetDevice(device_));  // arcpool's own thread: its device is arcpool's to set
  }

  void run_on_device(void (*fn)(void*), void* context) noexcept override {
    device_guard guard(device_, primary_);
    if (guard.status() == ARCPOOL_STATUS_SUCCESS) fn(context);
  }

 private:
  const int device_;
  /// The retain of the device's primary context: destroyed after the destructor's body, so
  /// that the pool goes before it.
  const std::unique_ptr<primary_context> context_;
  const CUcontext primary_;  ///< the device's primary context
  const cudaMemPool_t pool_;
  const bool owned_;
  const uint32_t handle_types_;  ///< the owned pool's IPC handle types
};

}  // namespace

bool cuda_device_usable(int device, std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
    return false;
  }
  if (device < 0 || device >= count) {
    *why = "device " + std::to_string(device) + " does not exist (" + std::to_string(count) +
           " devices)";
    return false;
  }
  int pools = 0;
  const cudaError_t queried =
      cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
  if (queried != cudaSuccess) cudaGetLastError();  // ours only, as in check()
  if (queried != cudaSuccess || pools == 0) {
    *why = "device " + std::to_string(device) + " does not support stream-ordered memory pools";
    return false;
  }
  return true;
}

bool cuda_any_device_usable() {
  int count = 0;
  const bool counted = cudaGetDeviceCount(&count) == cudaSuccess;
  if (!counted) cudaGetLastError();  // ours only, as in check()
  std::string why;
  for (int device = 0; counted && device < count; ++device)
    if (cuda_device_usable(device, &why)) return true;
  return false;
}

std::unique_ptr<driver> make_cuda_driver(const driver_config& config, arcpool_status_t* status) {
  std::string why;
  if (!cuda_device_usable(config.device, &why)) {
    *status = fail(ARCPOOL_STATUS_NO_DEVICE, "CUDA driver unavailable: %s", why.c_str());
    return nullptr;
  }
  auto context = std::make_unique<primary_context>(config.device);
  *status = context->status();
  if (*status != ARCPOOL_STATUS_SUCCESS) return nullptr;
  device_guard guard(config.device, context->get());
  *status = guard.status();
  if (*status != ARCPOOL_STATUS_SUCCESS) return nullptr;
  // Creating the allocator is unsafe under another thread's global capture: cudaFree(NULL)
  // initializes the runtime (NVIDIA's Warp lists "cudaFree(0) during lazy context / allocator
  // init" among the calls that need the relaxed mode), and the pool calls below.
  relaxed_capture_guard relaxed;
  *status = check(cudaFree(nullptr), "cudaFree(nullptr) (runtime initialization)");
  if (*status != ARCPOOL_STATUS_SUCCESS) return nullptr;
  arm_exit_hook();  // after the runtime registered its own teardown, so ours runs first

  if (config.pool_source != ARCPOOL_POOL_OWNED && !config.peer_devices.empty()) {
    *status = fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                   "peer_devices apply to an owned pool (ARCPOOL_POOL_OWNED): arcpool does not "
                   "change the access of device %d's own pools",
                   config.device);
    return nullptr;
  }
  cudaMemPool_t pool = nullptr;
  switch (config.pool_source) {
    case ARCPOOL_POOL_OWNED:
      *status = cuda::create_owned_pool(config, &pool);
      break;
    case ARCPOOL_POOL_DEVICE_DEFAULT:
      *status =
          check(cudaDeviceGetDefaultMemPool(&pool, config.device), "cudaDeviceGetDefaultMemPool");
      break;
    case ARCPOOL_POOL_DEVICE_CURRENT:
      *status = check(cudaDeviceGetMemPool(&pool, config.device), "cudaDeviceGetMemPool");
      break;
  }
  if (*status != ARCPOOL_STATUS_SUCCESS) return nullptr;
  const bool owned = config.pool_source == ARCPOOL_POOL_OWNED;
  try {
    return std::make_unique<cuda_driver>(config.device, std::move(context), pool, owned,
                                         config.ipc_handle_types);
  } catch (const std::bad_alloc&) {
    // The driver destroys the pool it owns; without host memory for it, the pool goes here
    // (under the device and capture-mode guards above).
    if (owned) discard(cudaMemPoolDestroy(pool));
    *status = fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for the CUDA driver");
    return nullptr;
  }
}

}  // namespace arcpool::detail
