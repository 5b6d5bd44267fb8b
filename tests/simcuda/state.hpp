// simcuda's model of the CUDA runtime: devices, streams, events, pools, memory and the clocks
// that order them. One global lock guards it all; stream workers run the queued work.
//
// The rules come from the CUDA Runtime API reference (the doc comments of cuda_runtime_api.h
// and driver_types.h, CUDA 13.0) and the CUDA C++ Programming Guide; each is cited where it is
// implemented. A rule without a citable sentence is "unverified": it warns, never fails.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace simcuda {

/// A vector clock: for each stream id, the highest sequence number known to happen before.
class vclock {
 public:
  /// The entry for `stream` (0 when absent).
  uint64_t get(uint64_t stream) const;
  /// Raises the entry for `stream` to at least `seq`.
  void raise(uint64_t stream, uint64_t seq);
  /// Joins `other` in (entry-wise maximum).
  void join(const vclock& other);

 private:
  std::vector<std::pair<uint64_t, uint64_t>> entries_;  // sorted by stream id
};

struct stream_obj;
struct event_obj;
struct pool_obj;
struct capture_obj;
struct graph_obj;
struct exec_obj;
struct ipc_table;
struct ipc_event_shared;

/// A point in one stream's order: the op with sequence `seq` on `stream`.
struct stream_point {
  stream_obj* stream = nullptr;
  uint64_t seq = 0;
};

/// One queued command.
struct op {
  uint64_t seq = 0;
  std::string what;                 ///< the call that enqueued it, for messages
  std::vector<stream_point> after;  ///< execution dependencies (waits, implicit syncs)
  std::function<void()> run;        ///< the work, run by the stream's worker without the lock
  std::function<void()> complete;   ///< bookkeeping, run with the lock once `run` returned
  bool host_function = false;       ///< run flags the worker as inside a host function
  uintptr_t watches = 0;            ///< host memory a stream memory op reads or writes
  /// A stream memory wait: whether its condition is unmet now (only a host write can end it).
  std::function<bool()> held;
};

/// A stream: its queue, its order and its worker.
struct stream_obj {
  /// graph_lane: one branch of an executable graph's replays (never a user's handle).
  enum class kind { legacy, per_thread, created, graph_lane };
  uint64_t id = 0;  ///< cudaStreamGetId: unique in the process
  uintptr_t handle = 0;
  int device = 0;
  /// The context it was created in (context_id): its device's primary context, or one made
  /// with cuCtxCreate. cuStreamGetCtx answers it; cudaEventRecord compares it.
  uintptr_t context = 0;
  kind type = kind::created;
  bool blocking = true;  ///< synchronizes with the legacy stream (not cudaStreamNonBlocking)
  bool destroyed = false;
  std::deque<std::unique_ptr<op>> queue;
  uint64_t enqueued = 0;   ///< seq of the last op enqueued
  uint64_t completed = 0;  ///< seq of the last op completed
  vclock clock;            ///< what the next op on this stream happens after
  uint64_t host_clock_version = 0;
  uint64_t barrier_epoch = 0;
  std::mt19937_64 rng;
  capture_obj* capture = nullptr;  ///< the capture this stream records into, if any
  bool worker_started = false;
  std::string name() const;
};

/// An event: its most recent record.
struct event_obj {
  uintptr_t handle = 0;
  uintptr_t context = 0;  ///< the context it was created in (context_id); 0: not known
  bool destroyed = false;
  bool recorded = false;
  stream_point point;  ///< the record's place
  vclock clock;        ///< what the record happens after
  /// The id of the capture it was last recorded in (0: recorded outside captures). An id, not
  /// the capture: a capture is deleted when it ends, and a later one may take its address.
  uint64_t captured_in = 0;
  std::vector<size_t> captured_tail;  ///< the captured record's nodes (what a wait depends on)
  unsigned flags = 0;
  /// Interprocess events: the record state other processes see (ipc.cpp).
  ipc_event_shared* shared = nullptr;
  int shared_fd = -1;   ///< the memfd behind `shared` (created events; others open it by path)
  bool opened = false;  ///< opened with cudaIpcOpenEventHandle: waits and queries read `shared`
};

/// Graph memory: device memory of one allocation node, reserved at capture for the graph's life
/// (its address is fixed across launches). Released when the graph, its instantiation and the
/// last launch's allocation are all gone.
struct graph_memory {
  int device = 0;
  uintptr_t base = 0;
  size_t bytes = 0;
  ~graph_memory();
};

/// One access a captured node makes, checked at every replay.
struct node_access {
  uintptr_t p = 0;
  size_t bytes = 0;
  bool host_ok = false;
  std::string what;
  bool write = false;
};

/// One node of a captured graph.
struct graph_node {
  /// work: a kernel, copy, memset or host function; alloc and free: graph memory nodes;
  /// wait_external: cudaStreamWaitEvent with cudaEventWaitExternal (the event's state at launch).
  enum class kind { work, alloc, free, wait_external };
  kind type = kind::work;
  std::string what;
  std::vector<size_t> deps;  ///< earlier nodes of the graph this one depends on
  size_t branch = 0;         ///< the captured stream it came from (index in the capture)
  std::function<void()> run;
  bool host_function = false;
  std::vector<node_access> touches;
  uintptr_t address = 0;                 ///< alloc, free: the graph allocation
  std::shared_ptr<graph_memory> memory;  ///< alloc
  event_obj* external = nullptr;         ///< wait_external
};

/// A user object (cudaUserObjectCreate): a destructor run once its references are gone.
struct user_obj {
  uintptr_t handle = 0;
  void* ptr = nullptr;
  cudaHostFn_t destroy = nullptr;
  uint64_t refs = 0;
};

/// A stream capture sequence.
struct capture_obj {
  uint64_t id = 0;
  stream_obj* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  bool ended = false;
  std::vector<stream_obj*> streams;                  ///< streams that joined (origin first)
  std::map<stream_obj*, std::vector<size_t>> tails;  ///< what each stream's next node depends on
  graph_obj* graph = nullptr;                        ///< the graph being captured into
};

/// A graph: made at cudaStreamBeginCapture, handed out by cudaStreamEndCapture.
struct graph_obj {
  uintptr_t handle = 0;
  int device = 0;
  bool destroyed = false;
  bool captured = false;  ///< cudaStreamEndCapture returned it
  std::vector<graph_node> nodes;
  size_t branches = 1;
  std::map<user_obj*, uint64_t> user_refs;  ///< references the graph owns
  exec_obj* exec = nullptr;                 ///< its live instantiation, when it has memory nodes
  /// The thread inside a call on the graph across a pause point, and that call (resolve_graph).
  std::thread::id inside;
  const char* inside_call = nullptr;
  bool has_memory_nodes() const;
};

/// An executable graph (cudaGraphInstantiate): the nodes, replayed by each launch on lanes.
struct exec_obj {
  uintptr_t handle = 0;
  bool destroyed = false;
  unsigned long long flags = 0;
  graph_obj* graph = nullptr;  ///< null once the graph was destroyed
  std::vector<graph_node> nodes;
  std::vector<stream_obj*> lanes;  ///< one per branch
  std::vector<uintptr_t> unfreed;  ///< allocations of the last launch still live
  stream_point last;               ///< the last launch's end
  vclock last_clock;
  std::map<user_obj*, uint64_t> user_refs;
};

/// One access recorded against an allocation: the latest per stream.
struct access_record {
  uint64_t seq = 0;
  std::string what;  ///< the call and its stream
};

/// An allocation instance: memory handed out once, until its free.
struct allocation {
  uintptr_t base = 0;
  size_t bytes = 0;
  pool_obj* pool = nullptr;                 ///< null for cudaMalloc memory and graph memory
  std::shared_ptr<graph_memory> graph_mem;  ///< graph memory: its node's reservation
  exec_obj* exec = nullptr;                 ///< graph memory: the instantiation that allocated it
  stream_point alloc;                       ///< the allocation's place (stream null: synchronous)
  std::string alloc_what;
  stream_point free_point;
  std::string free_what;
  bool freed = false;
  std::unordered_map<uint64_t, access_record> accesses;  ///< by stream id
  std::unordered_map<uint64_t, access_record> writes;    ///< the last write, by stream id
};

/// A block a pool holds for reuse after its free.
struct free_block {
  uintptr_t base = 0;
  size_t bytes = 0;
  stream_obj* stream = nullptr;  ///< where it was freed
  uint64_t seq = 0;              ///< the free op
  bool done = false;             ///< the free executed
  uint64_t order = 0;            ///< recency (higher: freed later)
};

/// A chunk of device memory a pool reserved.
struct chunk {
  uintptr_t base = 0;
  size_t bytes = 0;
  size_t carved = 0;  ///< bump offset of blocks carved so far
  size_t live = 0;    ///< blocks carved and not free
};

/// A memory pool (cudaMemPoolCreate or a device's default).
struct pool_obj {
  uintptr_t handle = 0;
  int device = 0;
  bool destroyed = false;
  bool is_default = false;
  size_t max_size = 0;  ///< 0: the device's capacity
  unsigned handle_types = 0;
  int follow_event_dependencies = 1;
  int allow_opportunistic = 1;
  int allow_internal_dependencies = 1;
  uint64_t release_threshold = 0;
  uint64_t reserved = 0, reserved_high = 0, used = 0, used_high = 0;
  std::vector<chunk> chunks;
  std::vector<free_block> free_blocks;
  std::vector<int> peers;  ///< devices granted access
  bool imported = false;   ///< cudaMemPoolImportFromShareableHandle: allocates nothing
  size_t region = 0;       ///< imported: its index in runtime::regions
};

/// Another process's device memory, mapped by an imported pool the way the device's own is:
/// no host access at `base`, a private alias for simulated work.
struct import_region {
  uintptr_t base = 0;
  uintptr_t alias = 0;
  size_t bytes = 0;
  ipc_table* table = nullptr;  ///< the exporting device's import table (shared)
  uint64_t inode = 0;          ///< the exporting device's memfd
};

/// One simulated device: memory, legacy stream, default and current pool, context.
struct device_obj {
  int ordinal = 0;
  uintptr_t base = 0;   ///< device addresses: [base, base + capacity), no host access
  uintptr_t alias = 0;  ///< the same memory, as simulated kernels and copies reach it
  size_t capacity = 0;
  int fd = -1;                           ///< the memfd behind both mappings
  uint64_t inode = 0;                    ///< the memfd's inode (names it in export data)
  ipc_table* ipc = nullptr;              ///< the memfd's tail: who imported what (ipc.cpp)
  std::map<size_t, size_t> free_ranges;  ///< offset -> bytes, unreserved device memory
  size_t reserved = 0;
  stream_obj* legacy = nullptr;
  std::vector<stream_obj*> streams;  ///< every stream of the device not yet drained after destroy
  /// The clocks of destroyed streams that drained and left `streams`: a device synchronization
  /// orders the host after their work too ("all preceding requested tasks").
  vclock drained_clock;
  pool_obj* default_pool = nullptr;
  pool_obj* current_pool = nullptr;
  uint64_t contexts = 0;
  bool context = false;
  uint64_t primary_retains = 0;  ///< cuDevicePrimaryCtxRetain calls not yet released
  uint64_t barrier_epoch = 0;
  std::vector<stream_point> barrier;
  vclock barrier_clock;
};

/// Settings read once from the environment (docs/simcuda.md lists them).
struct config {
  int devices = 2;
  size_t capacity = size_t{4} << 30;
  uint64_t seed = 1;
  bool slow = false;
  long sticky_after_launches = -1;
  long oom_after_allocations = -1;
  long import_free_delay_us = 0;  ///< how long an imported pointer's free takes to execute
};

/// The whole simulated runtime.
struct runtime {
  std::mutex mu;
  std::condition_variable cv;  ///< notified on every completion and state change
  /// Held while a host function runs: cudaLaunchHostFunc, "Host functions without a mandated
  /// order (such as in independent streams) execute in undefined order and may be serialized".
  /// simcuda serializes them all, the order CUDA may choose that deadlocks a host function
  /// waiting for another stream's.
  std::mutex host_functions;
  config cfg;
  std::vector<std::unique_ptr<device_obj>> devices;
  std::unordered_map<uintptr_t, std::unique_ptr<stream_obj>> streams;
  std::unordered_map<uintptr_t, std::unique_ptr<event_obj>> events;
  std::unordered_map<uintptr_t, std::unique_ptr<pool_obj>> pools;
  std::unordered_map<uintptr_t, std::unique_ptr<graph_obj>> graphs;
  std::unordered_map<uintptr_t, std::unique_ptr<exec_obj>> execs;
  std::unordered_map<uintptr_t, std::unique_ptr<user_obj>> user_objects;
  std::unordered_map<uintptr_t, int> created_contexts;  ///< cuCtxCreate's, not destroyed: device
  std::deque<user_obj*> destructors;                    ///< user objects whose destructors are due
  bool destructor_thread = false;
  std::vector<std::unique_ptr<capture_obj>> captures;
  std::map<uintptr_t, std::unique_ptr<allocation>> live;   ///< by base address
  std::map<uintptr_t, std::unique_ptr<allocation>> freed;  ///< the last freed per base
  std::map<uintptr_t, size_t> pinned;                      ///< cudaHostAlloc: base -> bytes
  /// Imported pools' memory: written with the lock, then counted; read without it (simulated
  /// work translates addresses unlocked), so it never moves.
  std::array<import_region, 64> regions;
  std::atomic<size_t> region_count{0};
  vclock host_clock;  ///< what the host has observed complete
  uint64_t host_clock_version = 1;
  uint64_t next_handle = 1;
  uint64_t next_stream_id = 1;
  uint64_t next_capture_id = 1;
  uint64_t free_order = 0;
  long launches = 0;
  long allocations = 0;
  cudaError_t sticky = cudaSuccess;
  bool unloaded = false;  ///< simcuda_unload_driver: every later call fails
  uint64_t hidden_waits = 0;
  uint64_t unverified = 0;
  std::vector<std::string> violations;  ///< not yet taken
  uint64_t violation_total = 0;
  std::map<std::string, cudaError_t> fail_next;  ///< simcuda_fail_next: one failure per call
  std::map<std::string, unsigned> delays;        ///< simcuda_delay_calls: milliseconds per call
  uint64_t destructors_run = 0;                  ///< user-object destructors that returned
  uint64_t longest_destructor_us = 0;            ///< the longest of them
  std::unordered_map<std::string, uint64_t> calls;
};

/// The runtime, created on first use and never destroyed (workers may outlive main).
runtime& rt();

/// The calling thread's runtime state.
struct thread_state {
  /// The device of the current context, or (none current) the one the runtime would select.
  int device = 0;
  /// The runtime's own per-thread device: set by cudaSetDevice only, never by the driver's
  /// context calls, and the device selected when no context is current.
  int selected = 0;
  /// Whether a context is current: the device's primary context, or created_context.
  bool context_current = false;
  /// The handle of the cuCtxCreate context current, or 0 when the current one is primary.
  uintptr_t created_context = 0;
  cudaError_t last_error = cudaSuccess;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  bool in_host_function = false;
  std::map<int, stream_obj*> per_thread;  ///< cudaStreamPerThread, per device
  struct launch_config {
    dim3 grid, block;
    size_t shared = 0;
    cudaStream_t stream = nullptr;
  };
  std::vector<launch_config> configs;
};
thread_state& ts();

// --- state.cpp ---------------------------------------------------------------------------
/// Records a violation (undefined behaviour CUDA would not report) and prints it.
void violation(const std::string& message);
/// Prints a warning of an unverified rule (it does not fail).
void unverified(const std::string& message);
/// Counts a call, flags calls from host functions, and returns the sticky error, if any.
/// With the lock.
cudaError_t enter(const char* name);

/// Opens an entry point: takes the lock (as `lock`, with `r` the runtime) and returns the
/// sticky error, if any.
#define SIMCUDA_ENTER(name)                \
  ::simcuda::runtime& r = ::simcuda::rt(); \
  std::unique_lock<std::mutex> lock(r.mu); \
  if (cudaError_t sticky_ = ::simcuda::enter(name)) return ::simcuda::ret(sticky_)
/// Sets the thread's last error to `e` (unless success) and returns it.
cudaError_t ret(cudaError_t e);
/// The calls that have a pause point (simcuda_delay_calls).
constexpr const char* kPausingCalls[] = {"cudaEventQuery", "cudaGraphRetainUserObject",
                                         "cudaStreamIsCapturing"};
/// A pause point of the call `name`: sleeps for its simcuda_delay_calls delay, if any, with
/// `lock` (the runtime's) released, so that other threads may call in meanwhile.
void pause_point(std::unique_lock<std::mutex>& lock, const char* name);
/// printf into a string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/// A new handle value, never reused.
uintptr_t new_handle();
/// Device `d`, or null when it does not exist.
device_obj* device_at(int d);
/// Creates the primary context of `d` if it has none (call with the lock).
void ensure_context(device_obj& d);
/// The identity of the calling thread's current context, making one current as context_device
/// does: the handle of a cuCtxCreate context, or the primary context's (its device_obj).
uintptr_t context_id();
/// The device whose primary context a runtime call that needs one acts in: the current
/// context's, else device 0's, initialized and made current (with the lock).
device_obj& context_device();

// --- streams.cpp -------------------------------------------------------------------------
/// A new stream on `d` (with the lock).
stream_obj* make_stream(device_obj& d, stream_obj::kind type, bool blocking);
/// Resolves a stream handle (0, cudaStreamLegacy, cudaStreamPerThread or created) for the
/// current device; `per_thread_default` maps 0 to the per-thread stream (the _ptsz entry
/// points). Null (with a violation for destroyed handles) when invalid. With the lock.
stream_obj* resolve_stream(cudaStream_t s, bool per_thread_default, const char* call);
/// Enqueues `o` on `s` (with the lock): legacy-stream implicit synchronization, device
/// barriers, host clock, scheduler. Returns the op's seq.
uint64_t enqueue(stream_obj& s, std::unique_ptr<op> o);
/// Blocks (releasing the lock) until `p` completed, then joins `clock` into the host clock.
/// `clock` must be a copy: the stream's own clock moves on while the lock is released.
void host_wait(std::unique_lock<std::mutex>& lock, stream_point p, const vclock& clock);
/// Whether `p` completed.
bool done(stream_point p);
/// Lets `s` run as far as it can (releasing the lock while waiting): returns once `s` is idle,
/// held by an unmet stream memory wait, or waits on streams that are themselves settled and
/// cannot go on. `path` holds the streams being settled further up (a wait cycle ends there).
void settle(std::unique_lock<std::mutex>& lock, stream_obj& s, std::vector<stream_obj*>& path);
/// Starts a device-wide barrier: later work on any stream of `d` follows all earlier work
/// (implicit synchronization). `why` names the call.
void device_barrier(device_obj& d, const char* why);
/// Synchronizes with every stream of `d` (releasing the lock while waiting).
void device_wait(std::unique_lock<std::mutex>& lock, device_obj& d);
/// Whether work for `s` is captured instead of run: then the node `what` was recorded (and
/// `*node`, when given, points at it for the caller to fill in), or `*error` says why it could
/// not be (with the lock).
bool capture_node(stream_obj& s, const std::string& what, cudaError_t* error,
                  graph_node** node = nullptr);
/// Warns (unverified rule) when the potentially unsafe call `call` is made while this
/// thread's capture mode prohibits it.
void check_unsafe_unverified(const char* call);
/// Whether potentially unsafe calls are prohibited for this thread now (capture modes).
bool unsafe_prohibited();
/// Invalidates the captures that prohibit this thread's unsafe call.
void invalidate_prohibiting_captures();
/// For a potentially unsafe call (cudaMalloc; a pool allocation or free on a stream that is not
/// capturing; a pointer export): true, with the prohibiting captures invalidated, when this
/// thread's capture mode prohibits it; the call then answers cudaErrorStreamCaptureUnsupported.
bool refuse_unsafe_call();
/// Whether a blocking stream of `d` is capturing (the legacy stream is then unusable).
capture_obj* blocking_capture_on(device_obj& d);
/// The capture `e` was last recorded in while it has not ended, else null.
capture_obj* live_capture_of(const event_obj& e);

// --- memory.cpp --------------------------------------------------------------------------
/// The allocation holding [p, p + bytes), or null. With the lock.
allocation* find_live(uintptr_t p, size_t bytes);
/// Checks an access to [p, p + bytes) by op `seq` on `s` (enqueued already): device memory
/// must be allocated and ordered after its allocation, and a `write` (a memset, a copy's
/// destination) ordered after every other stream's last write to the allocation; records the
/// access. Host memory is accepted when `host_ok` (copies) or when it is pinned. With the lock.
void check_access(stream_obj& s, uint64_t seq, uintptr_t p, size_t bytes, bool host_ok,
                  const std::string& what, bool write = false);
/// Translates a device address to the alias simulated work uses (host addresses unchanged).
void* alias_of(uintptr_t p);
/// Whether `p` is a device address.
bool is_device_address(uintptr_t p);
/// Trims the pools of `d` down to their release thresholds (at synchronizations).
void apply_release_thresholds(device_obj& d);
/// Sets up device `d`'s memory and default pool (at start).
void init_device_memory(device_obj& d);
/// Reserves `bytes` of device `d`'s memory for a graph allocation node; null when full.
std::shared_ptr<graph_memory> reserve_graph_memory(device_obj& d, size_t bytes);
/// Frees the graph allocation `a` in stream order on `s` as op `o` (a free node's replay, or a
/// free outside the graph), with the same ordering checks as any free. Returns the op's seq.
/// With the lock.
uint64_t graph_free(allocation& a, stream_obj& s, const std::string& what,
                    std::unique_ptr<op> o = nullptr);

// --- ipc.cpp -----------------------------------------------------------------------------
/// Bytes after a device's memory in its memfd: the import table.
size_t ipc_table_bytes();
/// Maps and initializes device `d`'s import table (at start).
void init_ipc_table(device_obj& d);
/// The imported region holding `p`, or null.
const import_region* import_region_of(uintptr_t p);
/// The exporting process frees `a` (of a pool with handle types) now, as op `who`: a violation
/// while a living importing process has not freed its import. With the lock.
void check_no_live_imports(device_obj& d, uintptr_t base, const std::string& who);
/// An importer's free of its import at `base` (of the imported `pool`) executed: its hold on
/// the export ends.
void release_import(const pool_obj& pool, uintptr_t base);
/// Interprocess events (with the lock): creation, a record's op, and an opened event's wait,
/// query and synchronization.
cudaError_t ipc_event_init(event_obj& e);
/// cudaEventDestroy of an interprocess event: other processes' opened copies see it destroyed.
void ipc_event_destroyed(event_obj& e);
void ipc_event_record(event_obj& e, op& o);
cudaError_t ipc_event_wait(stream_obj& s, event_obj& e);
cudaError_t ipc_event_query(const event_obj& e);
void ipc_event_synchronize(std::unique_lock<std::mutex>& lock, const event_obj& e);

// --- graphs.cpp --------------------------------------------------------------------------
/// Drops `count` references of `u`; the last runs its destructor on the destructor thread.
void release_user_object(user_obj& u, uint64_t count);
/// A new graph for a capture starting on `d` (with the lock).
graph_obj* make_graph(int device);
/// Destroys a graph that will never be handed out (an invalidated capture).
void drop_graph(graph_obj& g);

}  // namespace simcuda
