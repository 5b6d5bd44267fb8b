/*
 * arcpool — C API.
 *
 * A stream-ordered device-memory allocator on cudaMallocAsync pools that knows, for every
 * allocation, its origin (device and stream), how many owners are responsible for freeing it
 * (the owner count, changed by preserve/discard) and which streams may still use it (fences).
 *
 * Ordering contract, written once: every "_async" operation is stream-ordered and never blocks
 * the host. Memory returned by an allocation on stream S may be used by work queued on S after
 * the call. A deallocation is ordered after all work queued so far on the caller's stream, on
 * the allocation's current stream and on every stream recorded with arcpool_record_use; the
 * memory may then be reused by later work. Functions that block say so.
 *
 * Ownership in signatures: `out_*` parameters receive a new reference the caller must release
 * (arcpool_allocation_release) unless stated otherwise; other pointer parameters are borrowed
 * for the duration of the call.
 *
 * Thread safety: every function may be called from any thread concurrently, on the same or
 * different objects, unless its comment says otherwise. No function may be called from inside
 * stream-ordered host work (a CUDA host callback): CUDA forbids it and the host driver refuses
 * it with ARCPOOL_STATUS_NOT_PERMITTED.
 *
 * Errors: every function returning arcpool_status_t leaves all state unchanged on failure
 * (unless stated) and sets a message for the calling thread, read with arcpool_last_error().
 */
#ifndef ARCPOOL_ARCPOOL_H_
#define ARCPOOL_ARCPOOL_H_

#include <stddef.h>
#include <stdint.h>

#include "arcpool/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------------------------------- */
/* Versions and basic types                                                                    */
/* ----------------------------------------------------------------------------------------- */

/** Version of this header: major * 10000 + minor * 100 + patch. */
#define ARCPOOL_VERSION 100

/** Returns the version of the linked library (same encoding as ARCPOOL_VERSION). Thread-safe;
 * never blocks. */
ARCPOOL_API int arcpool_version(void);

/**
 * A stream. Type-compatible with cudaStream_t (both are `struct CUstream_st*`), so CUDA
 * streams are passed directly. NULL is the legacy default stream. NULL and cudaStreamPerThread
 * name the allocator's device's default streams, whatever the calling thread's current device
 * (design.md §6, "Default streams"). On the host driver a stream is a worker created by
 * arcpool_stream_create.
 */
typedef struct CUstream_st* arcpool_stream_t;

/** An allocator: one device, one pool, its event pool and its reclaim worker. */
typedef struct arcpool_allocator arcpool_allocator_t;

/**
 * A handle to an allocation or to a view of one. Holds one reference (see
 * arcpool_allocation_retain); references keep the control record readable and are distinct
 * from owner claims (arcpool_allocation_preserve / _discard).
 */
typedef struct arcpool_allocation arcpool_allocation_t;

/** Result of every fallible call. */
typedef enum arcpool_status_t {
  ARCPOOL_STATUS_SUCCESS = 0,
  /** An argument is invalid (null handle or out-pointer, bad alignment, bad flags, ...). */
  ARCPOOL_STATUS_INVALID_ARGUMENT = 1,
  /** The device, the pool or the allocator's hard limit cannot satisfy the request. */
  ARCPOOL_STATUS_OUT_OF_MEMORY = 2,
  /** The caller is not (the only) owner: preserve/discard at owner count 0, or deallocate or
   * export while other owners remain (without FORCE). Nothing changed. */
  ARCPOOL_STATUS_NOT_OWNER = 3,
  /** The allocation was already deallocated or exported. Nothing changed. */
  ARCPOOL_STATUS_ALREADY_DEALLOCATED = 4,
  /** A raw pointer that no live arcpool allocation contains. Nothing freed. */
  ARCPOOL_STATUS_UNKNOWN_POINTER = 5,
  /** The operation is not supported in this situation (e.g. a stream capturing a CUDA graph).
   * Nothing changed. */
  ARCPOOL_STATUS_UNSUPPORTED = 6,
  /** A CUDA call failed; the message names the CUDA error (e.g. a sticky device fault). */
  ARCPOOL_STATUS_CUDA_ERROR = 7,
  /** Called from inside stream-ordered host work, where driver calls are forbidden. */
  ARCPOOL_STATUS_NOT_PERMITTED = 8,
  /** The requested driver has no usable device (e.g. ARCPOOL_DRIVER_CUDA without a GPU). */
  ARCPOOL_STATUS_NO_DEVICE = 9,
  /** The other process of an IPC connection is gone: it exited, was killed or closed its
   * side (arcpool/ipc.h). */
  ARCPOOL_STATUS_PEER_GONE = 10
} arcpool_status_t;

/** Returns a static string naming `status` ("ARCPOOL_STATUS_NOT_OWNER", ...). Thread-safe;
 * never blocks; never NULL. */
ARCPOOL_API const char* arcpool_status_string(arcpool_status_t status);

/** Returns the message of the most recent failing arcpool call on the calling thread ("" if
 * none). The pointer stays valid until the next arcpool call on this thread. Never blocks. */
ARCPOOL_API const char* arcpool_last_error(void);

/* ----------------------------------------------------------------------------------------- */
/* Allocators                                                                                  */
/* ----------------------------------------------------------------------------------------- */

/** Which driver serves an allocator. */
typedef enum arcpool_driver_kind_t {
  /** CUDA when any device is usable (it exists and has memory pools), else host.
   * ARCPOOL_DRIVER=cuda|host overrides AUTO. On a machine with a usable device, a device that
   * does not exist or has no memory pools is refused (NO_DEVICE), never served from host
   * memory. */
  ARCPOOL_DRIVER_AUTO = 0,
  /** The CUDA runtime: the product. */
  ARCPOOL_DRIVER_CUDA = 1,
  /** Host worker threads and host memory: a test and development stand-in, never a
   * performance claim. */
  ARCPOOL_DRIVER_HOST = 2,
  /** Does nothing and hands out fake addresses: measures arcpool's own bookkeeping in
   * benchmarks. Never for real memory. */
  ARCPOOL_DRIVER_NULL = 3
} arcpool_driver_kind_t;

/** Returns "auto", "cuda", "host" or "null". Thread-safe; never blocks; never NULL. */
ARCPOOL_API const char* arcpool_driver_name(arcpool_driver_kind_t kind);

/** The driver ARCPOOL_DRIVER_AUTO resolves to for `device` (ARCPOOL_DRIVER first, then CUDA if
 * any device is usable, else host: the same for every device; an allocator for a device that
 * cannot serve then fails with NO_DEVICE), without creating anything. ARCPOOL_DRIVER_AUTO when
 * ARCPOOL_DRIVER names no driver: arcpool_last_error() says why, and creating an allocator with
 * AUTO fails with INVALID_ARGUMENT. May initialize the CUDA runtime. */
ARCPOOL_API arcpool_driver_kind_t arcpool_auto_driver(int device);

/** Where an allocator's cudaMemPool_t comes from. */
typedef enum arcpool_pool_source_t {
  /** arcpool creates and owns the pool (default); its settings are the options below. */
  ARCPOOL_POOL_OWNED = 0,
  /** Adopt the device's default pool (cudaDeviceGetDefaultMemPool); not owned. */
  ARCPOOL_POOL_DEVICE_DEFAULT = 1,
  /** Adopt the device's current pool (cudaDeviceGetMemPool); not owned. */
  ARCPOOL_POOL_DEVICE_CURRENT = 2
} arcpool_pool_source_t;

/**
 * Where a deallocation that is not a plain same-stream free runs (design.md §4). Every
 * strategy orders the free after the caller's stream, the current stream and every
 * recorded-use stream; they differ in false dependencies and in how soon memory returns.
 */
typedef enum arcpool_routing_t {
  /** The allocator's default for the case (see arcpool_allocator_options_t). */
  ARCPOOL_ROUTING_DEFAULT = 0,
  /** The caller's stream waits on the other streams' fences, then frees. */
  ARCPOOL_ROUTING_WAIT_AND_FREE = 1,
  /** The origin stream waits on the fences, then frees into its own lane; falls back to
   * wait-and-free (counted) when the origin is not provably alive or is capturing a graph. */
  ARCPOOL_ROUTING_PREFER_ORIGIN = 2,
  /** The reclaim worker polls the fences and frees on the origin stream (if provably alive)
   * or on arcpool's own reclaim stream once they completed. No false dependency. */
  ARCPOOL_ROUTING_DEFERRED = 3
} arcpool_routing_t;

/** Called when an allocation cannot be satisfied after caches were flushed and pending
 * reclaims completed. May free memory; return non-zero to ask for one more attempt. Runs on
 * the allocating thread, outside arcpool's locks; may call arcpool. */
typedef int (*arcpool_oom_callback_t)(size_t requested_bytes, void* user_data);

/** Debug hook: called right before arcpool enqueues the free of [pointer, pointer + bytes) on
 * `stream`, after every wait the free needs, so that work it enqueues on `stream` (a poison
 * fill) runs after the last use and before the memory can be reused. Runs on the deallocating
 * thread or the reclaim worker, with arcpool's locks held and the allocator's device current
 * (CUDA: its primary context, the thread's own restored after; NULL is that device's legacy
 * default stream): it may enqueue work on `stream` (a kernel, or
 * arcpool_stream_launch_host_func) and must call nothing else of arcpool. */
typedef void (*arcpool_before_free_t)(void* pointer, size_t bytes, arcpool_stream_t stream,
                                      void* user_data);

/** Version of arcpool_allocator_options_t this header describes. */
#define ARCPOOL_ALLOCATOR_OPTIONS_VERSION 1

/** Largest event_pool_capacity an allocator accepts (events kept for reuse). */
#define ARCPOOL_MAX_EVENT_POOL_CAPACITY ((size_t)1 << 20)

/** Options of arcpool_allocator_create. Fill with arcpool_allocator_options_init first. */
typedef struct arcpool_allocator_options_t {
  size_t struct_size; /**< sizeof(arcpool_allocator_options_t) */
  uint32_t version;   /**< ARCPOOL_ALLOCATOR_OPTIONS_VERSION */
  /** Device ordinal served by the allocator. Default 0. */
  int device;
  /** Driver. Default ARCPOOL_DRIVER_AUTO. */
  arcpool_driver_kind_t driver;
  /** Pool source. Default ARCPOOL_POOL_OWNED. */
  arcpool_pool_source_t pool_source;
  /** Owned pools: bytes the pool keeps reserved across synchronizations. Default UINT64_MAX
   * (never release); 0 unmaps idle memory at every synchronize. */
  uint64_t release_threshold;
  /** Owned pools: cudaMemPoolReuseFollowEventDependencies. Default 1. */
  int reuse_follow_event_dependencies;
  /** Owned pools: cudaMemPoolReuseAllowOpportunistic. Default 1. */
  int reuse_allow_opportunistic;
  /** Owned pools: cudaMemPoolReuseAllowInternalDependencies. Default 0: it inserts hidden
   * waits between streams, the serialization arcpool's routing avoids. */
  int reuse_allow_internal_dependencies;
  /** Owned pools: maximum pool size in bytes (cudaMemPoolProps::maxSize). Default 0: the
   * device's limit. */
  size_t max_pool_bytes;
  /** Hard limit on bytes held by this allocator (live plus awaiting their free), enforced by
   * arcpool's own counter. Default 0: none (nor does a limit past INT64_MAX limit anything). */
  size_t hard_limit_bytes;
  /** Owned pools: IPC handle types (cudaMemAllocationHandleType bits), checked against what the
   * device supports. Default 0. */
  uint32_t ipc_handle_types;
  /** Owned pools: devices that get read/write access to the pool. Borrowed for the call. */
  const int* peer_devices;
  size_t peer_device_count; /**< Number of entries in peer_devices. */
  /** Routing when the deallocating stream or the current stream is not the origin stream.
   * Default ARCPOOL_ROUTING_DEFAULT (currently DEFERRED; see docs/routing.md). */
  arcpool_routing_t foreign_stream_routing;
  /** Routing when other streams' uses are recorded. Default ARCPOOL_ROUTING_DEFAULT
   * (currently DEFERRED; see docs/routing.md). */
  arcpool_routing_t use_record_routing;
  /** The fast path: bytes of freed blocks each stream keeps for reuse by its own later
   * allocations (streams arcpool created or registered, and the legacy default stream).
   * Default 64 MiB; 0 turns the cache off. */
  size_t stream_cache_bytes;
  /** The fast path caches blocks up to this size (exact sizes, never rounded). Default 1 MiB. */
  size_t stream_cache_max_block;
  /** Host driver: simulated device capacity in bytes. Default 0: 16 GiB. */
  size_t host_capacity_bytes;
  /** Host driver: hand out reserved address space with no backing memory (for replaying traces
   * larger than the machine); such memory must never be touched. Default 0. */
  int host_reserve_only;
  /** Host driver, for tests and fuzzing: nonzero selects the deterministic mode with this seed.
   * Streams have no threads: their work runs when the caller synchronizes (a seeded scheduler
   * picks the order), no reclaim worker starts, and a happens-before checker verifies every
   * stream operation (see src/drivers/deterministic.hpp). Default 0. */
  uint64_t host_deterministic_seed;
  /** Events kept for reuse by the event pool. Default 0: 1024. At most 2^20
   * (ARCPOOL_MAX_EVENT_POOL_CAPACITY; INVALID_ARGUMENT above). */
  size_t event_pool_capacity;
  /** Out-of-memory callback (see arcpool_oom_callback_t). Default NULL. */
  arcpool_oom_callback_t on_out_of_memory;
  void* on_out_of_memory_user_data; /**< Passed to on_out_of_memory. */
  /** Debug: poison hook (see arcpool_before_free_t). Default NULL. */
  arcpool_before_free_t before_free;
  void* before_free_user_data; /**< Passed to before_free. */
  /** The memory history: the last this many actions on arcpool's blocks (allocations, frees
   * requested and completed, blocks taken from and given back to the pool) and the state of
   * every block held, read as PyTorch's memory snapshot (arcpool_memory_snapshot). Each
   * recorded operation then takes a mutex. The room for the actions (about 40 bytes each) is
   * made when the allocator is created (INVALID_ARGUMENT for more than a ring can hold).
   * Default 0: off, unless ARCPOOL_HISTORY=N is set in the environment when the allocator is
   * created. */
  size_t history_entries;
} arcpool_allocator_options_t;

/** Fills `options` with the defaults documented on each field. Thread-safe; never blocks. */
ARCPOOL_API void arcpool_allocator_options_init(arcpool_allocator_options_t* options);

/**
 * Creates an allocator for `options->device` (`options` may be NULL for all defaults). On
 * success `*out_allocator` is a new allocator the caller destroys with
 * arcpool_allocator_destroy. Fails with NO_DEVICE when the CUDA driver is requested (or
 * ARCPOOL_DRIVER=cuda is set, or AUTO found a usable device) and `options->device` is not
 * usable, INVALID_ARGUMENT for bad options.
 * Thread-safe; may block while CUDA initializes.
 */
ARCPOOL_API arcpool_status_t arcpool_allocator_create(const arcpool_allocator_options_t* options,
                                                      arcpool_allocator_t** out_allocator);

/**
 * Releases the caller's allocator. Live allocations keep it alive: the pool, event pool and
 * reclaim worker are torn down when the last allocation handle is gone. Blocks until pending
 * reclaims of that allocator complete when it is the last reference. Never fails; NULL is a
 * no-op.
 */
ARCPOOL_API void arcpool_allocator_destroy(arcpool_allocator_t* allocator);

/** Adds a reference to the allocator, released by one more arcpool_allocator_destroy (for
 * objects that must keep it alive, such as a stream wrapper). Thread-safe; never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocator_retain(arcpool_allocator_t* allocator);

/** Returns the driver actually serving `allocator` (CUDA, HOST or NULL). Never blocks. */
ARCPOOL_API arcpool_driver_kind_t arcpool_allocator_driver(const arcpool_allocator_t* allocator);

/** Returns the device ordinal of `allocator`. Never blocks. */
ARCPOOL_API int arcpool_allocator_device(const arcpool_allocator_t* allocator);

/**
 * Returns memory the allocator holds but does not use: flushes the per-stream caches, completes
 * pending reclaims (blocking on their fences), synchronizes arcpool's streams that are not
 * capturing (the pool releases only frees the host saw complete), then trims the pool to
 * `keep_bytes` reserved (owned pools only: a borrowed pool's reserve is the application's).
 * Blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_allocator_trim(arcpool_allocator_t* allocator,
                                                    size_t keep_bytes);

/** Blocks until all work queued on the allocator's device has completed, on every stream
 * (cudaDeviceSynchronize on that device; the thread's current device and context are left as
 * they were): frees queued on streams arcpool does not know are then observed, and a trim
 * can give their memory back, as PyTorch's cudaMallocAsync backend does in empty_cache. As
 * cudaDeviceSynchronize, it fails while any stream of the device captures a graph, and that
 * capture is invalidated (design.md §9). */
ARCPOOL_API arcpool_status_t arcpool_allocator_synchronize_device(arcpool_allocator_t* allocator);

/* ----------------------------------------------------------------------------------------- */
/* Streams                                                                                     */
/* ----------------------------------------------------------------------------------------- */

/** Creates a non-blocking stream (a cudaStream_t on the CUDA driver, a worker on the host
 * driver) that arcpool knows to be alive until arcpool_stream_destroy. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_stream_create(arcpool_allocator_t* allocator,
                                                   arcpool_stream_t* out_stream);

/** Destroys a stream made by arcpool_stream_create. Work already queued still runs; fences
 * arcpool still needs from it are taken first. UNSUPPORTED, with nothing changed, while the
 * stream is capturing a graph. When cudaStreamDestroy itself fails (a broken context), the
 * stream is arcpool's no more (its fences were taken, its cache given back): the status names
 * the failure, and a retry is INVALID_ARGUMENT. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_stream_destroy(arcpool_allocator_t* allocator,
                                                    arcpool_stream_t stream);

/** Blocks until all work queued on `stream` has completed. UNSUPPORTED, with the capture left
 * intact, while `stream` is capturing a graph (CUDA would invalidate the capture). */
ARCPOOL_API arcpool_status_t arcpool_stream_synchronize(arcpool_allocator_t* allocator,
                                                        arcpool_stream_t stream);

/**
 * Tells `allocator` that the application stream `stream` stays alive until
 * arcpool_stream_unregister, so arcpool may enqueue on it later (frees routed to it as an
 * origin, fences for uses recorded on it taken at deallocation time). Registrations are
 * counted: a stream registered n times (a framework's capture wrapper and the application may
 * each register it) stays registered until the n-th unregister. A stream created by
 * arcpool_stream_create may be registered too; each such registration is withdrawn by an
 * unregister, and the stream stays arcpool's until arcpool_stream_destroy. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_stream_register(arcpool_allocator_t* allocator,
                                                     arcpool_stream_t stream);

/** Withdraws a registration. The last one first takes any fence arcpool still needs from
 * `stream`, after which arcpool never touches it again. INVALID_ARGUMENT if it was not
 * registered; UNSUPPORTED, with the registration kept, while the last one's stream is capturing
 * a graph. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_stream_unregister(arcpool_allocator_t* allocator,
                                                       arcpool_stream_t stream);

/** A function run in stream order by arcpool_stream_launch_host_func. */
typedef void (*arcpool_host_fn_t)(void* user_data);

/**
 * Enqueues `fn(user_data)` on `stream` (cudaLaunchHostFunc on the CUDA driver; on the host
 * driver the way work is done on a stream). `fn` must not call arcpool or CUDA. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_stream_launch_host_func(arcpool_allocator_t* allocator,
                                                             arcpool_stream_t stream,
                                                             arcpool_host_fn_t fn, void* user_data);

/* ----------------------------------------------------------------------------------------- */
/* Allocations                                                                                 */
/* ----------------------------------------------------------------------------------------- */

/** Flags of arcpool_allocate_async. */
typedef enum arcpool_allocation_flags_t {
  ARCPOOL_ALLOCATION_FLAG_NONE = 0,
  /** Nobody can know when the memory is safe to free: a stream-ordered deallocation enqueues
   * nothing and the memory goes back when the last reference is released and every fence it
   * holds has completed. */
  ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME = 1u << 0
} arcpool_allocation_flags_t;

/** Default and maximum supported alignment of arcpool_allocate_async. */
#define ARCPOOL_DEFAULT_ALIGNMENT ((size_t)256)
#define ARCPOOL_MAX_ALIGNMENT ((size_t)1 << 21)

/**
 * Allocates `size` bytes aligned to `alignment` (0: 256; a power of two up to
 * ARCPOOL_MAX_ALIGNMENT) in stream order on `stream`, which becomes the allocation's origin
 * and current stream. On success `*out_allocation` holds one owner claim and one reference.
 * Zero bytes give a valid allocation whose data pointer is NULL. OUT_OF_MEMORY (after
 * flushing caches, completing pending reclaims, one retry and the options' callback) leaves
 * the allocator usable. On a stream capturing a graph: graph memory or a graph pool's block
 * where docs/graphs.md says so (the CUDA driver), UNSUPPORTED otherwise (the host drivers; a
 * stream arcpool cannot fence after the graph). Never blocks, except on the out-of-memory
 * path.
 */
ARCPOOL_API arcpool_status_t arcpool_allocate_async(arcpool_allocator_t* allocator, size_t size,
                                                    size_t alignment, arcpool_stream_t stream,
                                                    uint32_t flags,
                                                    arcpool_allocation_t** out_allocation);

/** Flags of arcpool_deallocate_async. At most one routing flag may be set. */
typedef enum arcpool_deallocate_flags_t {
  ARCPOOL_DEALLOCATE_FLAG_NONE = 0,
  /** Deallocate even while other owners remain; their later calls get ALREADY_DEALLOCATED. */
  ARCPOOL_DEALLOCATE_FLAG_FORCE = 1u << 0,
  /** Routing override: ARCPOOL_ROUTING_WAIT_AND_FREE for this call. */
  ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE = 1u << 1,
  /** Routing override: ARCPOOL_ROUTING_PREFER_ORIGIN for this call. */
  ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN = 1u << 2,
  /** Routing override: ARCPOOL_ROUTING_DEFERRED for this call. */
  ARCPOOL_DEALLOCATE_FLAG_DEFERRED = 1u << 3
} arcpool_deallocate_flags_t;

/**
 * Deallocates in stream order, ordered after all work queued so far on `stream`, on the
 * current stream and on every recorded-use stream (design.md §4). Consumes the caller's claim
 * when it is the only owner (or the allocation is UNOWNED); NOT_OWNER while other owners
 * remain (unless FORCE); ALREADY_DEALLOCATED the second time. The handle's reference is not
 * released: call arcpool_allocation_release. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_deallocate_async(arcpool_allocation_t* allocation,
                                                      arcpool_stream_t stream, uint32_t flags);

/** Adds an owner claim. NOT_OWNER at owner count 0 (never resurrects); ALREADY_DEALLOCATED
 * after deallocation. Lock-free; never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocation_preserve(arcpool_allocation_t* allocation);

/**
 * Removes one owner claim. `*out_was_last` (may be NULL) is set to 1 if the caller was the
 * last owner and must now deallocate, else 0. NOT_OWNER at owner count 0 (never wraps);
 * ALREADY_DEALLOCATED after deallocation. Lock-free; never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_allocation_discard(arcpool_allocation_t* allocation,
                                                        int* out_was_last);

/** Returns 1 if the allocation is live with exactly one owner (the caller may reuse it in
 * place after transferring it to the writing stream), else 0 (also for NULL). Never blocks. */
ARCPOOL_API int arcpool_allocation_is_terminal(const arcpool_allocation_t* allocation);

/** Discards one claim and releases one reference; if the claim was the last, first
 * deallocates on the allocation's current stream with the default routing. What the C++
 * handles do on destruction. The reference is released whatever the status (the handle must
 * not be used after this call): NOT_OWNER or ALREADY_DEALLOCATED change nothing else, and a
 * refused deallocation of the last claim leaves the allocation UNOWNED, freed by whoever
 * deallocates it or at its last reference. Never blocks. */
ARCPOOL_API arcpool_status_t
arcpool_allocation_discard_and_release(arcpool_allocation_t* allocation);

/** Adds a reference to the handle (not a claim). Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocation_retain(arcpool_allocation_t* allocation);

/**
 * Releases a reference. When the last reference to an allocation goes: a deallocated record is
 * freed (indeterminate-lifetime memory, imported or not, goes back now, once its fences
 * complete; other imported memory got its on_free at deallocation); a live or unowned
 * allocation is a leaked owner and is freed stream-ordered as an implicit free (counted). NULL
 * is a no-op. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_allocation_release(arcpool_allocation_t* allocation);

/** Placement flags: immutable facts recorded at allocation time. */
typedef enum arcpool_placement_flags_t {
  /** Stream-ordered: may be freed by a stream-ordered deallocation. */
  ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS = 1u << 0,
  /** See ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME. */
  ARCPOOL_PLACEMENT_FLAG_INDETERMINATE_LIFETIME = 1u << 1,
  /** Imported: arcpool never frees the memory; it calls the importer's on_free. */
  ARCPOOL_PLACEMENT_FLAG_EXTERNAL = 1u << 2,
  /** Graph memory: allocated on a stream capturing a CUDA graph (a graph allocation node, owned
   * by the graph, not the pool; its address is fixed for the graph's life). docs/graphs.md. */
  ARCPOOL_PLACEMENT_FLAG_GRAPH = 1u << 3,
  /** Lent by a graph pool during a capture: pool memory reserved outside the capture, which
   * goes back to its graph pool, never to the allocator's pool, when deallocated. */
  ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL = 1u << 4
} arcpool_placement_flags_t;

/** Version of arcpool_placement_t this header describes. */
#define ARCPOOL_PLACEMENT_VERSION 1

/** Immutable placement of an allocation. */
typedef struct arcpool_placement_t {
  size_t struct_size;             /**< set by the caller: sizeof(arcpool_placement_t) */
  uint32_t version;               /**< set by the caller: ARCPOOL_PLACEMENT_VERSION */
  int device;                     /**< origin device */
  arcpool_stream_t origin_stream; /**< origin stream handle as passed at allocation */
  uint64_t origin_stream_id;      /**< origin stream identity (cudaStreamGetId) */
  uint32_t flags;                 /**< arcpool_placement_flags_t bits */
  size_t size;                    /**< requested bytes of the allocation */
  size_t alignment;               /**< alignment of the data pointer */
} arcpool_placement_t;

/** Reads the placement of `allocation` (of its allocation, for a view). Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocation_placement(const arcpool_allocation_t* allocation,
                                                          arcpool_placement_t* out_placement);

/** Ownership state (design.md §3). */
typedef enum arcpool_allocation_state_t {
  ARCPOOL_ALLOCATION_LIVE = 0,        /**< owner count >= 1, not deallocated */
  ARCPOOL_ALLOCATION_UNOWNED = 1,     /**< the last owner discarded; a deallocation is due */
  ARCPOOL_ALLOCATION_DEALLOCATED = 2, /**< the one deallocation was accepted */
  ARCPOOL_ALLOCATION_EXPORTED = 3     /**< handed out as a raw pointer; arcpool won't free it */
} arcpool_allocation_state_t;

/** Version of arcpool_allocation_info_t this header describes. */
#define ARCPOOL_ALLOCATION_INFO_VERSION 1

/** A snapshot of an allocation's mutable state, for diagnostics and tests. */
typedef struct arcpool_allocation_info_t {
  size_t struct_size;               /**< set by the caller */
  uint32_t version;                 /**< set by the caller: ARCPOOL_ALLOCATION_INFO_VERSION */
  arcpool_allocation_state_t state; /**< ownership state */
  uint32_t owners;                  /**< owner count P */
  uint32_t references;              /**< reference count R of the allocation record */
  uint64_t current_stream_id;       /**< identity of the current stream */
  arcpool_stream_t current_stream;  /**< current stream handle */
  uint32_t use_records;             /**< number of recorded-use streams */
  uint64_t id;                      /**< allocation serial number, unique per process */
} arcpool_allocation_info_t;

/** Reads a snapshot of `allocation`'s state (of its allocation, for a view). Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocation_info(const arcpool_allocation_t* allocation,
                                                     arcpool_allocation_info_t* out_info);

/** Writes the data pointer (the view's start, for a view; NULL for zero bytes).
 * ALREADY_DEALLOCATED after deallocation or export. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocation_data(const arcpool_allocation_t* allocation,
                                                     void** out_data);

/** Returns the size in bytes (of the view, for a view); 0 for NULL. Never blocks. */
ARCPOOL_API size_t arcpool_allocation_size(const arcpool_allocation_t* allocation);

/**
 * Makes a view of bytes [offset, offset + size) of `allocation` (offsets of a view are
 * relative to it). The view holds one reference to the allocation and no claim; every
 * ownership call on it acts on the allocation. Release it with arcpool_allocation_release.
 * INVALID_ARGUMENT if the range is out of bounds. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_allocation_view(arcpool_allocation_t* allocation,
                                                     size_t offset, size_t size,
                                                     arcpool_allocation_t** out_view);

/**
 * Hands the memory out as a raw pointer: if the caller is the only owner (or the allocation
 * is UNOWNED), the current stream waits on every recorded use, the state becomes EXPORTED and
 * arcpool never frees the memory: the caller frees it with cudaFreeAsync on a stream ordered
 * after the current stream (host driver: free()). NOT_OWNER with other owners; UNSUPPORTED
 * for alignments above 256 (the data pointer is not the pool's pointer), and for memory not
 * taken from the allocator's pool: an import (its on_free or its owner frees it), graph memory
 * and a graph pool's block. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_allocation_export(arcpool_allocation_t* allocation,
                                                       void** out_pointer);

/* ----------------------------------------------------------------------------------------- */
/* Streams of an allocation                                                                    */
/* ----------------------------------------------------------------------------------------- */

/**
 * Hands the allocation to `to_stream`: `to_stream` waits on fences of the current stream and
 * of every recorded-use stream, the use records are cleared and `to_stream` becomes the current
 * stream. The previous streams must not touch the memory afterwards. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_transfer(arcpool_allocation_t* allocation,
                                              arcpool_stream_t to_stream);

/**
 * Records that `stream` also uses the allocation: its deallocation (and any transfer) is
 * ordered after `stream`'s work. For a stream arcpool knows alive (created or registered) the
 * fence is taken at deallocation; for any other stream it is taken now, and later work on
 * that stream is not covered. A use of the current stream adds nothing, but for the calling
 * thread's per-thread default stream, whose fence is taken again: frees from other threads,
 * which cannot name that stream, then wait for the work queued on it so far. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_record_use(arcpool_allocation_t* allocation,
                                                arcpool_stream_t stream);

/** Flags of arcpool_record_use_with_flags and arcpool_record_stream_with_flags. */
typedef enum arcpool_record_use_flags_t {
  ARCPOOL_RECORD_USE_FLAG_NONE = 0,
  /**
   * The caller guarantees that the stream stays alive until the allocation is deallocated (or
   * transferred away), as PyTorch's Tensor.record_stream assumes. The fence is then taken at
   * deallocation (or transfer) for any stream, so the stream's work queued up to then is
   * covered, not only its work queued so far. A per-thread default stream is also fenced now:
   * that fence is what a deallocation on another thread waits on (it cannot name the stream).
   */
  ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION = 1u << 0
} arcpool_record_use_flags_t;

/** arcpool_record_use with `flags` (arcpool_record_use_flags_t); INVALID_ARGUMENT for an
 * unknown flag. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_record_use_with_flags(arcpool_allocation_t* allocation,
                                                           arcpool_stream_t stream, uint32_t flags);

/* ----------------------------------------------------------------------------------------- */
/* Imports                                                                                     */
/* ----------------------------------------------------------------------------------------- */

/** Called exactly once when arcpool no longer uses imported memory (every fence complete),
 * outside arcpool's locks and never from a CUDA host callback. May call arcpool. Never called
 * when a fence could not be checked or taken (a failed CUDA call leaves arcpool's uses
 * unknown): counted in reclaim_failures instead. */
typedef void (*arcpool_on_free_t)(void* pointer, size_t size, void* user_data);

/** Flags of arcpool_import. */
typedef enum arcpool_import_flags_t {
  ARCPOOL_IMPORT_FLAG_NONE = 0,
  /** Move the foreign owner's claim in: `on_free` is then the free itself and is called exactly
   * once, including immediately when the import call fails (but never under a use whose fence
   * failed: see arcpool_on_free_t). Requires
   * `on_free`. Without it the import borrows: on_free (optional) only reports that arcpool's
   * uses completed, and a failed import calls nothing. */
  ARCPOOL_IMPORT_FLAG_CONSUME = 1u << 0,
  /** As ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME. */
  ARCPOOL_IMPORT_FLAG_INDETERMINATE_LIFETIME = 1u << 1
} arcpool_import_flags_t;

/**
 * Wraps foreign memory [pointer, pointer + size) as an EXTERNAL allocation whose origin and
 * current stream is `stream`, with one claim and one reference in `*out_allocation`. arcpool
 * never frees it; where it would, it calls `on_free(pointer, size, user_data)` once. Never
 * blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_import(arcpool_allocator_t* allocator, void* pointer,
                                            size_t size, arcpool_stream_t stream, uint32_t flags,
                                            arcpool_on_free_t on_free, void* user_data,
                                            arcpool_allocation_t** out_allocation);

/* ----------------------------------------------------------------------------------------- */
/* Raw-pointer entry points (frameworks)                                                       */
/* ----------------------------------------------------------------------------------------- */

/** Sets the allocator serving the raw-pointer entry points for `device` (NULL restores the
 * lazily created default). arcpool keeps its own reference; the caller may destroy its handle.
 * Allocations made by the previous allocator stay valid. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_default_allocator_set(int device,
                                                           arcpool_allocator_t* allocator);

/** Returns the allocator serving `device`'s raw-pointer entry points, creating it with default
 * options on first use. The pointer is borrowed: do not destroy it; it stays valid until
 * arcpool_default_allocator_set replaces it. Thread-safe. May block on creation. */
ARCPOOL_API arcpool_status_t arcpool_default_allocator_get(int device,
                                                           arcpool_allocator_t** out_allocator);

/** As arcpool_default_allocator_get, but never creates the allocator: `*out_allocator` is NULL
 * while `device` has none (or while its creation is still in progress). For queries
 * (statistics, a trim) that must not create one, and with it a CUDA context on a device the
 * process never used. Never blocks on devices 0-63 (on others, it waits for a creation in
 * progress). Any device number from 0 is accepted (one the system does not have has none);
 * INVALID_ARGUMENT for a negative one. */
ARCPOOL_API arcpool_status_t arcpool_default_allocator_find(int device,
                                                            arcpool_allocator_t** out_allocator);

/**
 * Allocates `size` bytes on `stream` from `device`'s default allocator and returns the data
 * pointer; NULL on failure (see arcpool_last_error) and for zero bytes. Never blocks (except
 * on the out-of-memory path). The signature PyTorch's CUDAPluggableAllocator calls.
 */
ARCPOOL_API void* arcpool_malloc_async(size_t size, int device, arcpool_stream_t stream);

/**
 * Deallocates the allocation containing `pointer` (interior pointers resolve to their
 * allocation) in stream order on `stream`. NULL is a no-op. UNKNOWN_POINTER if no live
 * by-pointer allocation contains it (by-pointer allocations of every allocator are found: of
 * arcpool_malloc_async, arcpool_allocator_malloc_async and arcpool_ambient_malloc): a double
 * free is detected only while the address has not been handed out again. INVALID_ARGUMENT,
 * with nothing freed, for a negative `device` or an allocation of another device. `size` is
 * informational. Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_free_async(void* pointer, size_t size, int device,
                                                arcpool_stream_t stream);

/** arcpool_record_use for the by-pointer allocation containing `pointer`, of any allocator
 * and device (as arcpool_free_async finds it). UNKNOWN_POINTER if none contains it. Never
 * blocks. */
ARCPOOL_API arcpool_status_t arcpool_record_stream(void* pointer, arcpool_stream_t stream);

/** arcpool_record_stream with `flags` (arcpool_record_use_flags_t). PyTorch's record_stream
 * hook passes ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_record_stream_with_flags(void* pointer,
                                                              arcpool_stream_t stream,
                                                              uint32_t flags);

/**
 * By-pointer allocation on a given allocator (what a memory resource needs): allocates like
 * arcpool_allocate_async and returns the data pointer, which arcpool_allocator_free_async or the
 * raw-pointer entry points free. `*out_pointer` is NULL for zero bytes. Never blocks (except on
 * the out-of-memory path).
 */
ARCPOOL_API arcpool_status_t arcpool_allocator_malloc_async(arcpool_allocator_t* allocator,
                                                            size_t size, size_t alignment,
                                                            arcpool_stream_t stream,
                                                            void** out_pointer);

/** Deallocates the by-pointer allocation containing `pointer` on `stream` (as
 * arcpool_free_async, on any allocator). NULL is a no-op. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocator_free_async(arcpool_allocator_t* allocator,
                                                          void* pointer, arcpool_stream_t stream);

/** Sets the allocator's hard limit on held bytes (0: none), e.g. a framework's memory
 * fraction. Allocations already made are kept; later ones fail with OUT_OF_MEMORY beyond it
 * (an allocation in its pool call while the limit is set is counted once the pool lent it, and
 * other threads' batched changes when they flush: up to 1 MiB each). Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocator_set_hard_limit(arcpool_allocator_t* allocator,
                                                              size_t bytes);

/** Writes the device's total memory in bytes (the simulated capacity on the host driver). */
ARCPOOL_API arcpool_status_t arcpool_allocator_device_memory(const arcpool_allocator_t* allocator,
                                                             size_t* out_bytes);

/* ----------------------------------------------------------------------------------------- */
/* Callers that pass no stream                                                                 */
/* ----------------------------------------------------------------------------------------- */

/** What a stream-less caller's allocation is ordered with (CuPy's C hook, Numba, ONNX
 * Runtime's OrtAllocator). */
typedef enum arcpool_ambient_policy_t {
  /** The legacy default stream (default): ordered with every blocking stream, as cudaMalloc
   * users expect from the legacy stream. */
  ARCPOOL_AMBIENT_LEGACY_DEFAULT = 0,
  /** One stream bound with arcpool_allocator_set_ambient_stream: for callers that do all their
   * work there. */
  ARCPOOL_AMBIENT_BOUND_STREAM = 1,
  /** Allocate on arcpool's own stream and synchronize it before returning; free after a device
   * synchronization: the memory behaves as cudaMalloc's does, usable on any stream. Blocks.
   * As with cudaFree, a free while any stream of the device captures fails and invalidates
   * that capture (design.md §9). */
  ARCPOOL_AMBIENT_SYNCHRONIZE = 2
} arcpool_ambient_policy_t;

/** Selects the ambient policy of `allocator` (`stream`: the bound stream for
 * ARCPOOL_AMBIENT_BOUND_STREAM, ignored otherwise). A bound stream operations could not name
 * (another device's; a destroyed one on the host drivers: CUDA leaves a destroyed handle
 * undefined) is INVALID_ARGUMENT, as is an unknown policy, the policy unchanged. Never
 * blocks. */
ARCPOOL_API arcpool_status_t arcpool_allocator_set_ambient_stream(arcpool_allocator_t* allocator,
                                                                  arcpool_ambient_policy_t policy,
                                                                  arcpool_stream_t stream);

/** Allocates for a caller that passes no stream, by the allocator's ambient policy. Blocks only
 * under ARCPOOL_AMBIENT_SYNCHRONIZE. */
ARCPOOL_API arcpool_status_t arcpool_ambient_malloc(arcpool_allocator_t* allocator, size_t size,
                                                    void** out_pointer);

/** Frees memory from arcpool_ambient_malloc, by the allocator's ambient policy. Blocks only
 * under ARCPOOL_AMBIENT_SYNCHRONIZE. */
ARCPOOL_API arcpool_status_t arcpool_ambient_free(arcpool_allocator_t* allocator, void* pointer);

/* ----------------------------------------------------------------------------------------- */
/* Allocation log                                                                              */
/* ----------------------------------------------------------------------------------------- */

/**
 * Starts logging every allocation and deallocation of `allocator` to the CSV file `path` in
 * RMM's columns (Thread,Time,Action,Pointer,Size,Stream; the stream as a hexadecimal handle),
 * replayable by tools/arcpool-replay and by RMM's replay benchmark. Replaces an open log. The
 * environment variable ARCPOOL_LOG=path opens one when an allocator is created: `path` for the
 * process's first allocator, then path.1, path.2... (trace.csv, trace.1.csv, ...) for the
 * next ones. Thread-safe; blocks on file I/O.
 */
ARCPOOL_API arcpool_status_t arcpool_allocator_log_open(arcpool_allocator_t* allocator,
                                                        const char* path);

/** Stops logging and closes the file (no-op when none is open). Blocks on file I/O. */
ARCPOOL_API arcpool_status_t arcpool_allocator_log_close(arcpool_allocator_t* allocator);

/* ----------------------------------------------------------------------------------------- */
/* Graph pools (docs/graphs.md)                                                                */
/* ----------------------------------------------------------------------------------------- */

/** A graph pool: memory of an allocator's pool, reserved outside any capture and lent only to
 * the captures it is bound to (arcpool's counterpart of PyTorch's private graph pools). */
typedef struct arcpool_graph_pool arcpool_graph_pool_t;

/** Creates an empty graph pool of `allocator` (CUDA driver; UNSUPPORTED on the host drivers,
 * which build no graphs). The caller owns one reference. */
ARCPOOL_API arcpool_status_t arcpool_graph_pool_create(arcpool_allocator_t* allocator,
                                                       arcpool_graph_pool_t** out_pool);

/** Binds the capture that `stream` records into to `pool`: until arcpool_graph_pool_end, every
 * allocation of the allocator on any stream of that capture comes from the pool. `stream` must
 * be capturing, and created or registered. The pool grows outside the capture when it must (an
 * allocation on the allocator's own stream, in relaxed capture mode, then a wait for it). A
 * block freed during the capture is lent again only to later allocations on the same stream in
 * that capture; once the capture's graph is gone, to any later capture bound to the pool.
 * Blocks deallocated outside captures are lent to later captures bound to the pool: graphs
 * that share a pool must not run concurrently. Never blocks, except when the pool grows. */
ARCPOOL_API arcpool_status_t arcpool_graph_pool_begin(arcpool_graph_pool_t* pool,
                                                      arcpool_stream_t stream);

/** Unbinds the captures of `pool` begun on `stream` (before or after the capture ended). */
ARCPOOL_API arcpool_status_t arcpool_graph_pool_end(arcpool_graph_pool_t* pool,
                                                    arcpool_stream_t stream);

/** Drops the caller's reference. The pool's memory goes back to the allocator's pool once the
 * graphs of every capture bound to it, or that one of its blocks was freed in, are destroyed
 * (with their instantiations and launches) and every allocation lent from it is deallocated.
 * NULL is a no-op. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_graph_pool_release(arcpool_graph_pool_t* pool);

/* ----------------------------------------------------------------------------------------- */
/* Statistics                                                                                  */
/* ----------------------------------------------------------------------------------------- */

/** Gauges: each has a `_current` and a `_peak` field in arcpool_stats_t. `_current` is exact
 * once the threads that change it are quiescent (read while they run, it is never below 0, and
 * `_peak` is never below it). To keep the hot path free of shared writes each thread batches its
 * changes (up to 1 MiB for byte gauges, 64 for allocations_in_use), so a `_peak` may miss a rise
 * shorter than that batch per thread, and may read up to a batch per thread above the true
 * high-water mark when memory allocated on one thread is freed on another (the first thread's
 * rises reach the total while the other's falls wait in its batch). A thread's allocations_in_use
 * is flushed whenever its bytes_in_use is, so the two peaks are taken together. Under a hard limit
 * bytes_held is exact (the limit is checked against it). */
#define ARCPOOL_STATS_GAUGES(X)                                                         \
  X(bytes_in_use, "bytes of live allocations (requested sizes)")                        \
  X(allocations_in_use, "live allocations")                                             \
  X(bytes_held, "bytes taken from the pool and not yet given back (live plus pending)") \
  X(bytes_pending_free, "bytes deallocated whose free waits on the reclaim worker")     \
  X(bytes_cached, "bytes kept in the per-stream caches (part of bytes_held)")

/** Counters: each is one uint64_t field of arcpool_stats_t. */
#define ARCPOOL_STATS_COUNTERS(X)                                                     \
  X(allocations, "successful allocations")                                            \
  X(deallocations, "accepted deallocations (explicit)")                               \
  X(frees, "blocks returned to the pool")                                             \
  X(cache_hits, "allocations served from a stream's cache (the fast path)")           \
  X(cache_frees, "deallocations whose block a stream's cache kept")                   \
  X(cache_flushes, "cached blocks returned to the pool (trim, pressure, retirement)") \
  X(same_stream_frees, "deallocations freed directly on the origin stream")           \
  X(cross_stream_frees, "deallocations involving another stream than the origin")     \
  X(origin_routed_frees, "frees that ran on the origin stream for another stream")    \
  X(origin_fallbacks, "prefer-origin frees whose origin was gone or capturing")       \
  X(deferred_frees, "frees queued on the reclaim worker")                             \
  X(transfers, "transfers")                                                           \
  X(use_records, "use records added")                                                 \
  X(fences_taken, "fences (event records) taken")                                     \
  X(ignored_deallocations, "deallocations of indeterminate-lifetime memory")          \
  X(implicit_frees, "leaked owners freed when the last reference went")               \
  X(imports, "imported allocations")                                                  \
  X(exports, "exported allocations")                                                  \
  X(oom_retries, "allocations retried after flushing and reclaiming")                 \
  X(oom_failures, "allocations that failed with OUT_OF_MEMORY")                       \
  X(reclaim_failures,                                                                 \
    "frees abandoned, the block written off (deferred, at a cache flush, "            \
    "or after a deallocation's commit): a CUDA call failed, or no host memory")

/** Graph memory (allocations on capturing streams; docs/graphs.md), reported apart from the
 * pool's: gauges with `_current` and `_peak` fields, then counters, after the pool's figures
 * (version 2 of arcpool_stats_t; a version 1 caller's struct ends before them). */
#define ARCPOOL_STATS_GRAPH_GAUGES(X)                                   \
  X(graph_bytes_in_use,                                                 \
    "bytes of live allocations made during captures (graph memory and " \
    "graph pools')")                                                    \
  X(graph_pool_bytes, "bytes graph pools reserved from the pool (part of bytes_held)")
#define ARCPOOL_STATS_GRAPH_COUNTERS(X)                                                      \
  X(graph_allocations, "allocations on capturing streams (graph memory or a graph pool's)")  \
  X(graph_frees, "allocations freed in their capture (free nodes, or back to a graph pool)") \
  X(graph_deferred_frees, "frees of earlier memory during a capture, deferred to the graph's end")

/** Version of arcpool_stats_t this header describes. */
#define ARCPOOL_STATS_VERSION 2

/** Statistics of one allocator (design.md §11). Field list: ARCPOOL_STATS_GAUGES and
 * ARCPOOL_STATS_COUNTERS, then the pool's figures. */
typedef struct arcpool_stats_t {
  size_t struct_size; /**< set by the caller: sizeof(arcpool_stats_t) */
  uint32_t version;   /**< set by the caller: ARCPOOL_STATS_VERSION */
#define ARCPOOL_STATS_GAUGE_FIELDS_(name, doc) \
  uint64_t name##_current;                     \
  uint64_t name##_peak;
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_GAUGE_FIELDS_)
#undef ARCPOOL_STATS_GAUGE_FIELDS_
#define ARCPOOL_STATS_COUNTER_FIELDS_(name, doc) uint64_t name;
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_COUNTER_FIELDS_)
#undef ARCPOOL_STATS_COUNTER_FIELDS_
  uint64_t pool_reserved_bytes_current; /**< bytes the pool has mapped now */
  uint64_t pool_reserved_bytes_peak;    /**< highest pool_reserved_bytes_current */
  uint64_t pool_used_bytes_current;     /**< bytes of the pool handed out now */
#define ARCPOOL_STATS_GRAPH_GAUGE_FIELDS_(name, doc) \
  uint64_t name##_current;                           \
  uint64_t name##_peak;
  ARCPOOL_STATS_GRAPH_GAUGES(ARCPOOL_STATS_GRAPH_GAUGE_FIELDS_)
#undef ARCPOOL_STATS_GRAPH_GAUGE_FIELDS_
#define ARCPOOL_STATS_GRAPH_COUNTER_FIELDS_(name, doc) uint64_t name;
  ARCPOOL_STATS_GRAPH_COUNTERS(ARCPOOL_STATS_GRAPH_COUNTER_FIELDS_)
#undef ARCPOOL_STATS_GRAPH_COUNTER_FIELDS_
} arcpool_stats_t;

/** Reads the statistics of `allocator`. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_stats_get(const arcpool_allocator_t* allocator,
                                               arcpool_stats_t* out_stats);

/** Resets every `_peak` gauge to its current value, pool_reserved_bytes_peak included (the
 * pool's own high-water mark) when the pool is owned; a borrowed pool's (ARCPOOL_POOL_DEVICE_*)
 * high-water mark is the application's, and is left as it is. Never blocks. */
ARCPOOL_API arcpool_status_t arcpool_stats_reset_peaks(arcpool_allocator_t* allocator);

/**
 * Writes the statistics as one JSON object into `buffer` (NUL-terminated, truncated to
 * `capacity`); `*out_length` (may be NULL) receives the full length without the NUL, so a call
 * with capacity 0 sizes the buffer. A NULL `allocator` gives the statistics of one that has
 * done nothing, every figure 0 (what a framework reports for a device it never used: see
 * arcpool_default_allocator_find). Never blocks.
 */
ARCPOOL_API arcpool_status_t arcpool_stats_json(const arcpool_allocator_t* allocator, char* buffer,
                                                size_t capacity, size_t* out_length);

/** Streams with a statistics row of their own: the first this many created or registered with
 * an allocator, or the legacy default stream from its first use (rows are never reused); every
 * other stream counts on the other-streams row. */
#define ARCPOOL_STREAM_STATS_ROWS 64

/** One row of statistics per stream (arcpool_stream_stats_list). An allocation counts on the
 * row of its origin stream. The figures are exact, and the rows add up to arcpool_stats_t's
 * bytes_in_use_current, allocations, cache_hits, cross_stream_frees and deferred_frees. */
typedef struct arcpool_stream_stats_t {
  arcpool_stream_t stream;       /**< the stream (NULL on the legacy stream's and other rows) */
  uint64_t stream_id;            /**< its identity (cudaStreamGetId on CUDA; 0 on the other row) */
  uint32_t other;                /**< 1 on the row of every stream without a row of its own */
  uint32_t retired;              /**< 1 once the stream was destroyed or unregistered */
  uint64_t bytes_in_use_current; /**< bytes of live allocations made on it */
  uint64_t bytes_in_use_peak;    /**< high-water mark of bytes_in_use_current */
  uint64_t allocations;          /**< successful allocations on it */
  uint64_t cache_hits;           /**< of which served from its stream cache */
  uint64_t cross_stream_frees;   /**< its allocations freed with another stream involved */
  uint64_t deferred_frees;       /**< its allocations' frees queued on the reclaim worker */
} arcpool_stream_stats_t;

/**
 * Copies the per-stream rows: every stream with a row of its own (retired ones included), then
 * the other-streams row, at most ARCPOOL_STREAM_STATS_ROWS + 1. Writes up to `capacity` rows
 * of `row_size` bytes each (sizeof(arcpool_stream_stats_t) of the caller's header: a smaller,
 * older struct gets its prefix) and sets `*out_count` to the number of rows there are, so a
 * call with capacity 0 sizes the array. INVALID_ARGUMENT for a `row_size` smaller than the
 * stream fields. Never blocks. `arcpool_stats_json` has the same rows under "streams".
 */
ARCPOOL_API arcpool_status_t arcpool_stream_stats_list(const arcpool_allocator_t* allocator,
                                                       arcpool_stream_stats_t* rows,
                                                       size_t row_size, size_t capacity,
                                                       size_t* out_count);

/**
 * Writes the allocator's memory snapshot: the dictionary PyTorch's
 * torch.cuda.memory._snapshot() returns, pickled (protocol 2), which PyTorch's
 * torch/cuda/_memory_viz.py and the https://pytorch.org/memory_viz page read (design.md §11).
 * "segments" has one segment per block arcpool holds, holding one block of the same size:
 * "active_allocated" while an allocation lives in it, "active_pending_free" from its
 * deallocation until its free completed, "inactive" while a stream's cache keeps it.
 * "device_traces" lists the history's entries, oldest first, in the list of the allocator's
 * device: alloc, free_requested, free_completed, segment_alloc and segment_free, each with its
 * addr, size, stream, time_us (microseconds since the epoch) and an empty frames list.
 *
 * `*out_size` (required) receives the snapshot's size. The snapshot is copied to `buffer` when
 * `capacity` holds it; a call with capacity 0 only sizes it, and a smaller nonzero capacity
 * fails with INVALID_ARGUMENT, writing nothing (the size may grow between two calls: size the
 * buffer with room). UNSUPPORTED when the allocator was created without history
 * (history_entries or ARCPOOL_HISTORY). Takes the history's mutex; never blocks on the device.
 */
ARCPOOL_API arcpool_status_t arcpool_memory_snapshot(const arcpool_allocator_t* allocator,
                                                     void* buffer, size_t capacity,
                                                     size_t* out_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#include "arcpool/ipc.h"

#endif /* ARCPOOL_ARCPOOL_H_ */
