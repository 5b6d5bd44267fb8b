// The one narrow interface between arcpool's model and the machine: streams, events, a pool and
// host work. Nothing outside src/drivers/ calls CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arcpool/arcpool.h"

namespace arcpool::detail {

/// A stream as the driver knows it (a cudaStream_t, or a host worker).
using stream_handle = arcpool_stream_t;
/// A timing-disabled event (a cudaEvent_t, or a host completion marker).
using event_handle = void*;

/// The legacy default stream and CUDA's per-thread default stream, as handles.
inline stream_handle legacy_default_stream() noexcept {
  return nullptr;
}
inline stream_handle legacy_stream_alias() noexcept {
  return reinterpret_cast<stream_handle>(uintptr_t{0x1});
}
inline stream_handle per_thread_default_stream() noexcept {
  return reinterpret_cast<stream_handle>(uintptr_t{0x2});
}

/// Figures of the pool as the driver reports them.
struct pool_figures {
  uint64_t reserved_current = 0;  ///< bytes mapped by the pool now
  uint64_t reserved_peak = 0;     ///< highest reserved_current since creation
  uint64_t used_current = 0;      ///< bytes handed out now (including frees not yet executed)
};

/// The capture a stream records into (cudaStreamGetCaptureInfo).
struct capture_info {
  uint64_t id = 0;        ///< the capture sequence's identity, unique in the process
  void* graph = nullptr;  ///< the graph being captured into (a cudaGraph_t)
};

/// What names one allocation of an exported pool to another process
/// (cudaMemPoolPtrExportData: "not a handle and may be shared through any IPC mechanism").
struct ipc_pointer_data {
  unsigned char bytes[64];
};
/// What names an interprocess event to another process (cudaIpcEventHandle_t).
struct ipc_event_data {
  char bytes[64];
};
/// A pool imported from another process (a cudaMemPool_t that cannot allocate).
using imported_pool = void*;

/// The options of an allocator that concern its driver.
struct driver_config {
  int device = 0;
  arcpool_driver_kind_t kind = ARCPOOL_DRIVER_AUTO;
  arcpool_pool_source_t pool_source = ARCPOOL_POOL_OWNED;
  uint64_t release_threshold = UINT64_MAX;
  bool reuse_follow_event_dependencies = true;
  bool reuse_allow_opportunistic = true;
  bool reuse_allow_internal_dependencies = false;
  size_t max_pool_bytes = 0;
  uint32_t ipc_handle_types = 0;
  std::vector<int> peer_devices;
  /// Also grant every other device that can reach this one (cudaDeviceCanAccessPeer), skipping
  /// the rest: the default allocators under ARCPOOL_PEER_ACCESS=1 (design.md §9).
  bool all_reachable_peers = false;
  size_t host_capacity_bytes = size_t{16} << 30;
  bool host_reserve_only = false;  ///< address space only, never touched (trace replay)
  /// Nonzero: the deterministic host driver with this scheduler seed (tests, fuzzing).
  uint64_t host_deterministic_seed = 0;
};

/// Streams, events, one pool and host work on one device. Every call sets and restores the
/// device it acts on. Every call is thread-safe. Calls return ARCPOOL_STATUS_SUCCESS or a
/// failure set with detail::fail (CUDA errors carry the CUDA name).
class driver {
 public:
  virtual ~driver() = default;

  /// ARCPOOL_DRIVER_CUDA, ARCPOOL_DRIVER_HOST or ARCPOOL_DRIVER_NULL.
  virtual arcpool_driver_kind_t kind() const noexcept = 0;
  /// The device ordinal.
  virtual int device() const noexcept = 0;

  // --- Streams ---------------------------------------------------------------------------
  /// Creates a non-blocking stream.
  virtual arcpool_status_t stream_create(stream_handle* out) = 0;
  /// Destroys a stream; queued work still runs. Never blocks.
  virtual arcpool_status_t stream_destroy(stream_handle s) = 0;
  /// Blocks until all work queued on `s` has completed.
  virtual arcpool_status_t stream_synchronize(stream_handle s) = 0;
  /// The process-unique identity of `s` (cudaStreamGetId; per-thread default streams resolve
  /// to the calling thread's stream).
  virtual arcpool_status_t stream_id(stream_handle s, uint64_t* out) = 0;
  /// Where `s` belongs: its device (cudaStreamGetDevice) and whether its context is that
  /// device's primary context, where this driver's events live (cuStreamGetCtx). By default
  /// this driver's device and context: the host and null drivers model one device, whose
  /// streams are all theirs.
  virtual arcpool_status_t stream_device(stream_handle s, int* out, bool* primary_context) {
    (void)s;
    *out = device();
    *primary_context = true;
    return ARCPOOL_STATUS_SUCCESS;
  }
  /// Whether `s` is capturing a graph.
  virtual arcpool_status_t stream_is_capturing(stream_handle s, bool* out) = 0;
  /// Starts capturing `s` into a graph (thread-local mode). Tests use it to prove UNSUPPORTED.
  virtual arcpool_status_t stream_begin_capture(stream_handle s) = 0;
  /// Ends the capture of `s` and discards the graph.
  virtual arcpool_status_t stream_end_capture(stream_handle s) = 0;
  /// Whether allocations, frees and deferred frees work on capturing streams (the CUDA driver:
  /// docs/graphs.md). The others cannot capture work, so they answer UNSUPPORTED.
  virtual bool supports_graphs() const noexcept { return false; }
  /// The capture `s` records into. Fails unless `s` is in an active capture.
  virtual arcpool_status_t stream_capture_info(stream_handle s, capture_info* out);
  /// Makes `fn(user_data)` run exactly once, when `graph` (a cudaGraph_t being captured), its
  /// instantiations and their launches are all gone (CUDA: a user object the graph owns). `fn`
  /// runs on a thread of the runtime's and must neither call the driver nor block. On failure it
  /// never runs.
  virtual arcpool_status_t graph_defer(void* graph, arcpool_host_fn_t fn, void* user_data);
  /// Enqueues `fn(user_data)` in stream order. `fn` must not call the driver.
  virtual arcpool_status_t launch_host_func(stream_handle s, arcpool_host_fn_t fn,
                                            void* user_data) = 0;

  // --- Events (timing disabled) ----------------------------------------------------------
  virtual arcpool_status_t event_create(event_handle* out) = 0;
  virtual void event_destroy(event_handle e) noexcept = 0;
  /// Records `e` on `s`: it completes when the work queued on `s` so far has completed.
  virtual arcpool_status_t event_record(event_handle e, stream_handle s) = 0;
  /// Makes later work on `s` wait for `e`'s most recent record as of this call.
  virtual arcpool_status_t stream_wait_event(stream_handle s, event_handle e) = 0;
  /// Whether `e`'s most recent record has completed. Never blocks.
  virtual arcpool_status_t event_query(event_handle e, bool* done) = 0;
  /// Blocks until `e`'s most recent record has completed.
  virtual arcpool_status_t event_synchronize(event_handle e) = 0;

  // --- Pool ------------------------------------------------------------------------------
  /// Allocates `bytes` in stream order on `s`, aligned to at least 256 bytes.
  /// ARCPOOL_STATUS_OUT_OF_MEMORY when the pool cannot grow.
  virtual arcpool_status_t pool_allocate(size_t bytes, stream_handle s, void** out) = 0;
  /// Frees `p` (of `bytes`) in stream order on `s`.
  virtual arcpool_status_t pool_free(void* p, size_t bytes, stream_handle s) = 0;
  /// Releases reserved memory down to `keep_bytes`; a pool the driver borrowed (the device's
  /// default or current one) is left as it is.
  virtual arcpool_status_t pool_trim(size_t keep_bytes) = 0;
  /// The pool's figures.
  virtual pool_figures pool_query() = 0;
  /// Restarts the pool's reserved high-water mark at its current reservation (CUDA:
  /// cudaMemPoolAttrReservedMemHigh), for an owned pool only. Drivers that keep no high-water
  /// mark do nothing.
  virtual void pool_reset_peak() noexcept {}
  /// The device's total memory (host driver: the simulated capacity).
  virtual arcpool_status_t device_memory(size_t* out) = 0;
  /// Blocks until all work on the device has completed (host driver: every host stream).
  virtual arcpool_status_t device_synchronize() = 0;

  // --- Processes (design.md §14; the CUDA driver only, the others answer UNSUPPORTED) ----
  /// A file descriptor that shares this driver's pool with another process
  /// (cudaMemPoolExportToShareableHandle). INVALID_ARGUMENT unless the pool is owned and was
  /// created with the POSIX file descriptor handle type. The caller closes it.
  virtual arcpool_status_t pool_export_fd(int* out);
  /// The data that names `p` (a pointer this driver's pool handed out) to an importer.
  virtual arcpool_status_t pool_export_pointer(void* p, ipc_pointer_data* out);
  /// An interprocess event (cudaEventInterprocess | cudaEventDisableTiming) and its handle.
  /// Destroyed with event_destroy.
  virtual arcpool_status_t ipc_event_create(event_handle* out, ipc_event_data* data);
  /// Opens another process's interprocess event; destroyed with event_destroy.
  virtual arcpool_status_t ipc_event_open(const ipc_event_data& data, event_handle* out);
  /// Imports another process's pool from `fd` (which the caller still closes).
  virtual arcpool_status_t pool_import_fd(int fd, imported_pool* out);
  /// Destroys an imported pool.
  virtual void imported_pool_destroy(imported_pool pool) noexcept { (void)pool; }
  /// Imports one allocation of `pool` (cudaMemPoolImportPointer).
  virtual arcpool_status_t import_pointer(imported_pool pool, const ipc_pointer_data& data,
                                          void** out);
  /// Frees an imported pointer in stream order on `s` (cudaFreeAsync).
  virtual arcpool_status_t imported_free(void* p, stream_handle s);

  // --- Threads ---------------------------------------------------------------------------
  /// Prepares the calling thread to be arcpool's reclaim worker (CUDA: relaxed capture mode,
  /// so its event queries never invalidate another thread's graph capture).
  virtual void enter_reclaim_thread() noexcept = 0;
  /// Runs the application's `fn(context)` with this driver's device current (CUDA: its primary
  /// context, the caller's restored after), so that work `fn` enqueues lands on this device,
  /// a default stream handle included. When the switch fails, `fn` does not run.
  virtual void run_on_device(void (*fn)(void*), void* context) noexcept { fn(context); }

  // --- Checking (the deterministic host driver; no-ops elsewhere) -------------------------
  /// False when everything must run on the caller's threads (deterministic mode): arcpool then
  /// starts no reclaim worker and completes reclaims itself.
  virtual bool allows_worker_threads() const noexcept { return true; }
  /// Whether note_release and note_acquire do anything (the deterministic driver's checker):
  /// asked once, so that the fast path makes neither call on the other drivers.
  virtual bool notes_cache_moves() const noexcept { return false; }
  /// A fast-path cache kept block [p, p + bytes) at this point of stream `s` (a release, as far
  /// as ordering goes) / handed it out again on `s` (an acquire).
  virtual void note_release(void* p, size_t bytes, stream_handle s) noexcept {
    (void)p, (void)bytes, (void)s;
  }
  virtual void note_acquire(void* p, size_t bytes, stream_handle s) noexcept {
    (void)p, (void)bytes, (void)s;
  }
};

/// What AUTO resolves to: ARCPOOL_DRIVER if set (ARCPOOL_DRIVER_AUTO, with an INVALID_ARGUMENT
/// message naming the value, when it names no driver), else CUDA when any device is usable, else
/// host. Never host for a device that does not exist or cannot pool memory on a machine with a
/// usable one: the CUDA driver refuses it (NO_DEVICE), where host memory would reach a framework
/// as device memory. Sets `*from_environment` (when given) if ARCPOOL_DRIVER decided.
arcpool_driver_kind_t resolve_auto_driver(bool* from_environment = nullptr);

/// Resolves AUTO (and ARCPOOL_DRIVER) and creates the driver `config` asks for.
arcpool_status_t make_driver(const driver_config& config, std::unique_ptr<driver>* out);

/// Whether the CUDA runtime has a usable device `device`; `why` says why not.
bool cuda_device_usable(int device, std::string* why);

/// Whether the CUDA runtime has a usable device (cuda_device_usable) of any index.
bool cuda_any_device_usable();

/// Test double: makes every later call of a host driver fail as a sticky CUDA error would
/// (ARCPOOL_STATUS_CUDA_ERROR naming cudaErrorIllegalAddress). No effect on a CUDA driver.
void inject_sticky_error(driver& d);

std::unique_ptr<driver> make_cuda_driver(const driver_config& config, arcpool_status_t* status);
std::unique_ptr<driver> make_null_driver(const driver_config& config);
std::unique_ptr<driver> make_deterministic_driver(const driver_config& config);
std::unique_ptr<driver> make_host_driver(const driver_config& config, arcpool_status_t* status);

}  // namespace arcpool::detail
