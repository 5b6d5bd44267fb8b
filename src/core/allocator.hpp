// One allocator: a device's pool, its event pool, its streams and its reclaim worker, and the
// ownership and routing model of design.md §3–§6 on top of them.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "core/allocation.hpp"
#include "core/fence.hpp"
#include "core/janitor.hpp"
#include "core/options.hpp"
#include "core/reclaimer.hpp"
#include "core/stream.hpp"
#include "drivers/driver.hpp"
#include "observe/allocation_log.hpp"
#include "observe/history.hpp"
#include "observe/nvtx.hpp"
#include "observe/stats.hpp"
#include "support/refcount.hpp"
#include "support/shards.hpp"
#include "support/status.hpp"
#include "support/thread_state.hpp"

namespace arcpool::detail {

class allocator {
 public:
  /// Creates an allocator with one reference (the caller's).
  static arcpool_status_t create(const allocator_config& config, allocator** out);

  allocator(const allocator&) = delete;
  allocator& operator=(const allocator&) = delete;

  /// Adds a handle reference (the user's, the default table's).
  void retain() noexcept { refs_.increment(); }
  /// Drops a handle reference. After the last one the allocator is torn down as soon as no
  /// allocation record is left (at once, or by the janitor; teardown blocks on pending
  /// reclaims).
  void release() noexcept;
  /// release for a caller that must not block (the default table, whose calls never do): after
  /// the last reference the janitor tears the allocator down, never the calling thread.
  void release_elsewhere() noexcept;

  /// An allocation record was created through a handle of this allocator / destroyed (counted
  /// in the shard `slot`). record_destroyed must be the record's last touch of the allocator.
  void record_created() noexcept { records_.add(1); }
  /// A record was created through a live record, with or without a handle left: the janitor
  /// may be summing the records while it is made (live_count::add_racing).
  void record_created_through_a_record() noexcept { records_.add_racing(); }
  void record_destroyed(shard_slot slot = thread_shard()) noexcept {
    // Read before the decrement: after it, the janitor may delete the allocator at any time.
    const bool closing = closing_.load(std::memory_order_seq_cst);
    records_.remove_release(slot);
    if (closing) janitor_wake();
  }
  /// No handle and no record left: the janitor may delete it.
  bool quiescent() const noexcept { return records_.zero(); }
  /// Deletes a quiescent allocator (the janitor's, or release's when nothing is left).
  static void destroy(allocator* a) noexcept { delete a; }
  /// The janitor's link to the next allocator it holds (janitor.cpp): holding one allocates
  /// nothing, since release, which hands it over, cannot fail.
  allocator*& janitor_link() noexcept { return janitor_link_; }

  driver& drv() const noexcept { return *driver_; }
  const allocator_config& config() const noexcept { return config_; }
  event_pool& events() noexcept { return events_; }

  // --- Streams (design.md §6) ------------------------------------------------------------
  arcpool_status_t create_stream(stream_handle* out);
  arcpool_status_t destroy_stream(stream_handle s);
  arcpool_status_t register_stream(stream_handle s);
  arcpool_status_t unregister_stream(stream_handle s);
  /// The statistics row of stream `s`: a known stream's or the legacy default stream's own, or
  /// the other-streams row.
  stream_stats& stream_stats_of(const stream_ref& s) noexcept {
    if (s.entry != nullptr) return s.entry->stats();
    return s.kind == stream_kind::legacy_default ? stream_stats_.legacy() : stream_stats_.other();
  }
  /// The per-stream rows (arcpool_stream_stats_list).
  size_t read_stream_stats(void* rows, size_t row_size, size_t capacity) const noexcept {
    return stream_stats_.read(rows, row_size, capacity);
  }
  /// Blocks until `s` drained; UNSUPPORTED, with the capture left intact, while `s` is
  /// capturing (a synchronization would invalidate the capture).
  arcpool_status_t synchronize_stream(stream_handle s);

  // --- Allocations (design.md §3–§5) -----------------------------------------------------
  /// Allocates; `*out` holds one claim and one reference. The fast path (allocate.cpp) serves a
  /// cache hit on a stream this thread looked up before; allocate_general everything else.
  arcpool_status_t allocate(size_t size, size_t alignment, stream_handle s, uint32_t flags,
                            allocation** out);
  /// Wraps foreign memory as an EXTERNAL allocation. A CONSUME import that fails calls
  /// `on_free` before returning.
  arcpool_status_t import(void* pointer, size_t size, stream_handle s, uint32_t flags,
                          arcpool_on_free_t on_free, void* user_data, allocation** out);
  /// The stream-ordered deallocation of design.md §4. The fast path (deallocate.cpp) serves a
  /// same-stream free into the stream's cache; deallocate_general everything else.
  arcpool_status_t deallocate(allocation& a, stream_handle s, uint32_t flags);
  /// Deallocates on the allocation's current stream (what a dropped last claim does).
  arcpool_status_t deallocate_on_current(allocation& a);
  arcpool_status_t preserve(allocation& a) {
    return ownership_failure(a, a.owners.preserve(), "preserve");
  }
  arcpool_status_t discard(allocation& a, bool* was_last) {
    return ownership_failure(a, a.owners.discard(was_last), "discard");
  }
  arcpool_status_t transfer(allocation& a, stream_handle to);
  /// `flags`: arcpool_record_use_flags_t.
  arcpool_status_t record_use(allocation& a, stream_handle s, uint32_t flags);
  arcpool_status_t export_memory(allocation& a, void** out);
  /// SUCCESS if operations may name stream `s` (its device, its context: what every
  /// operation's stream lookup checks); that lookup's refusal otherwise. Changes nothing an
  /// operation would not (the lookup fills this thread's stream-cache line).
  arcpool_status_t check_stream(stream_handle s) {
    stream_ref ignored;
    return resolve_stream(s, &ignored);
  }
  /// Records `e` after the work queued so far on every stream `a` may be used on, for `what` (an
  /// IPC send, design.md §14): on its current stream when it has no use records; else on
  /// `helper` (arcpool's own, alive, never capturing), once it waited on a fence of the current
  /// stream and of each use record (a use on a stream arcpool cannot prove alive stands as its
  /// fence from record_use, design.md §4). UNSUPPORTED, with nothing enqueued, for a retired
  /// current stream or another thread's per-thread default stream, whose work since it was
  /// named no fence taken here covers, and while a stream to fence captures.
  arcpool_status_t record_after_uses(allocation& a, event_handle e, stream_handle helper,
                                     const char* what);
  /// R reached 0: frees the record, and the memory where design.md §3 says so. Inline: the
  /// common case (deallocated memory of a determinate lifetime, whose record holds nothing to
  /// release, on a thread with room in its record list and its own statistics shard, the
  /// allocator not closing) only puts the record's block on the thread's list, with no call.
  /// (Otherwise the record is destroyed, and block_list::free places its block: on this
  /// thread's list if it has room, else another thread's block back to that thread's inbox
  /// while it is open, and this thread's own, or any other, to the heap.)
  void on_last_reference(allocation* a) noexcept {
    // No other thread reaches a record whose last reference went (the reference count's
    // acquire made the other holders' writes visible): no lock.
    thread_state& ts = this_thread_state();
    if (a->ended() && a->holds_nothing() && ts.slot.exclusive && ts.records.room != 0 &&
        !closing_.load(std::memory_order_seq_cst)) {
      // No destructor call: holds_nothing() shows it would release nothing, and nothing
      // depends on its side effects ([basic.life]/5).
      ts.records.push(a);
      records_.remove_release(shard_slot{ts.slot.index, true});
      return;
    }
    free_at_last_reference(a);
  }

  // --- Graph pools (capture.cpp, docs/graphs.md) -----------------------------------------
  arcpool_status_t create_graph_pool(graph_pool** out);
  /// Binds the capture `s` records into to `pool`.
  arcpool_status_t begin_graph_pool(graph_pool& pool, stream_handle s);
  /// Unbinds the captures of `pool` begun on `s`.
  arcpool_status_t end_graph_pool(graph_pool& pool, stream_handle s);
  /// Drops the binding of `capture` (a begin that failed after binding).
  void unbind_capture(uint64_t capture) noexcept;
  /// A bound capture's graph is gone (on the reclaim worker): its binding lends no more, and
  /// stays until end_graph_pool, which the application may call before or after.
  void capture_graph_gone(uint64_t capture) noexcept;
  /// Before a user object is armed with a posted task: starts the reclaim worker, which will
  /// run it. Throws std::bad_alloc or std::system_error, with nothing changed.
  void prepare_posted_task() { reclaimer_.start(); }
  /// A user object now holds `task` (after prepare_posted_task), which its destructor will
  /// post (post_task): takes the record that keeps the allocator alive through that post.
  /// Allocates nothing, so that it cannot fail once the user object is armed. Its callers act
  /// through a live record (a deallocation, a graph pool's binding), with or without a handle.
  void await_posted_task() noexcept {
    record_created_through_a_record();
    reclaimer_.expect_post();
  }
  /// From a user object's destructor (CUDA's internal thread, which may neither call CUDA nor
  /// block): hands `task` to the reclaim worker, which runs it, then drops await_posted_task's
  /// record, its last touch of the allocator.
  void post_task(posted_task* task) noexcept {
    reclaimer_.post(task);
    record_destroyed();
  }

  // --- By pointer (frameworks, memory resources), by_pointer.cpp ------------------------
  /// Allocates and records the allocation by its data pointer (null for zero bytes).
  arcpool_status_t malloc_by_pointer(size_t size, size_t alignment, stream_handle s, void** out);
  /// Deallocates the by-pointer allocation containing `p` on `s`. `device` < 0: any device.
  static arcpool_status_t free_by_pointer(void* p, stream_handle s, int device);
  /// Sets the hard limit on held bytes (0: none).
  void set_hard_limit(size_t bytes);

  // --- Callers that pass no stream, by_pointer.cpp --------------------------------------
  arcpool_status_t set_ambient(arcpool_ambient_policy_t policy, stream_handle s);
  arcpool_status_t ambient_malloc(size_t size, void** out);
  arcpool_status_t ambient_free(void* p);

  /// Flushes the caches, completes pending reclaims, synchronizes the known streams, then trims
  /// the pool to `keep_bytes`.
  arcpool_status_t trim(size_t keep_bytes);

  void read_stats(arcpool_stats_t* out) const;

  /// The memory history (arcpool_memory_snapshot).
  const history& memory_history() const noexcept { return history_; }

  /// The CSV allocation log (RMM's columns).
  allocation_log& log() noexcept { return log_; }

  /// Test hooks: one synchronous reclaim pass (returns items completed), and a full drain.
  size_t reclaim_poll_once() { return reclaimer_.poll_once(); }
  arcpool_status_t reclaim_drain() { return reclaimer_.drain(); }
  size_t reclaim_pending() const { return reclaimer_.pending(); }
  /// Test hook: the reclaimer (its worker is stopped from several threads at once, as the exit
  /// hook and the janitor do).
  reclaimer& reclaims() noexcept { return reclaimer_; }
  /// Restarts every high-water mark at its current value: the gauges' and the pool's.
  void reset_peaks() {
    stats_.reset_peaks();
    stream_stats_.reset_peaks();
    driver_->pool_reset_peak();
  }

 private:
  allocator(const allocator_config& config, std::unique_ptr<driver> drv);
  ~allocator();

  /// Which strategy a deallocation uses (design.md §4).
  enum class route { same_stream, wait_and_free, prefer_origin, deferred };

  /// Whether the fast path may serve an operation of the thread whose state is `ts`: nothing
  /// observes it that the fast path leaves out (the CSV log, the history, an NVTX tool), the
  /// caches are on, and the thread owns its statistics shard. A few loads and tests; every
  /// other case takes the general path.
  bool fast_path_open(const thread_state& ts) const noexcept {
    return plain_ && ts.slot.exclusive && !log_.enabled() && !nvtx::maybe_enabled();
  }
  /// allocate without the fast path: every flag, alignment, stream and observer.
  arcpool_status_t allocate_general(size_t size, size_t alignment, stream_handle s, uint32_t flags,
                                    allocation** out);
  /// deallocate without the fast path: every flag, route, stream and ownership state.
  arcpool_status_t deallocate_general(allocation& a, stream_handle s, uint32_t flags);
  /// deallocate's fast path after its checks (`a.mutex` held; `a` cacheable, used only on its
  /// origin stream `s`, which is alive and not capturing): accepts the deallocation of a sole
  /// owner and keeps the block in `cache`, `s`'s, both under the cache's lock, counting it on
  /// `row`, `s`'s statistics row. False, with nothing changed, when the owner is not the sole
  /// one or the cache refuses the block.
  [[gnu::always_inline]] inline bool free_into_cache(allocation& a, block_cache& cache,
                                                     stream_stats& row, stream_handle s,
                                                     thread_state& ts);

  /// What arcpool knows of `s`; refuses a capturing stream. A stream this thread resolved
  /// before costs one line of its stream cache; others take the slow path (the capture check,
  /// the stream's id and the registry).
  arcpool_status_t resolve_stream(stream_handle s, stream_ref* out) {
    return resolve_stream(this_thread_state(), s, out);
  }
  /// resolve_stream for the thread whose state `ts` is (the calling thread's).
  arcpool_status_t resolve_stream(thread_state& ts, stream_handle s, stream_ref* out) {
    const stream_cache_line& line = ts.stream_line(s);
    if (line.handle == s && line.stamp == streams_.stamp()) {
      *out = stream_ref{s, line.id, line.kind, line.entry};
      if (line.kind == stream_kind::per_thread_default) out->thread = this_thread_serial();
      return ARCPOOL_STATUS_SUCCESS;
    }
    return resolve_stream_slow(s, out);
  }
  arcpool_status_t resolve_stream_slow(stream_handle s, stream_ref* out);
  /// INVALID_ARGUMENT, naming both devices, when `s` belongs to another device than this
  /// allocator's (design.md §6).
  arcpool_status_t check_stream_device(stream_handle s);

  // --- Graph capture (capture.cpp, docs/graphs.md) --------------------------------------
  friend struct graph_gate;
  friend class graph_pool;
  /// The graph pool bound to capture `capture`, or null.
  graph_pool* bound_pool(uint64_t capture);
  /// Deallocates a graph pool's block: back to its pool, tagged for what may reuse it.
  arcpool_status_t return_to_graph_pool(allocation& a, const stream_ref& caller, bool force,
                                        bool implicit);
  /// Makes `pool` hear when the graph of `capture` is gone (capture_ended, on the reclaim
  /// worker), holding a reference of it until then. After prepare_posted_task. On failure
  /// (no host memory, the driver's refusal), nothing changed.
  arcpool_status_t tell_pool_of_graph_end(graph_pool& pool, const capture_info& capture);
  /// resolve_stream_slow for a capturing stream: only created and registered streams, found
  /// by handle (whether cudaStreamGetId is legal during capture is undocumented).
  arcpool_status_t resolve_capturing_stream(stream_handle s, stream_ref* out);
  /// UNSUPPORTED for capturing stream `s`, which arcpool neither created nor registered and
  /// whose capture is bound to none of its graph pools: arcpool cannot identify it.
  arcpool_status_t unknown_capturing_stream(stream_handle s);
  /// An allocation on the capturing stream `origin`: a graph allocation node.
  arcpool_status_t allocate_in_capture(size_t size, size_t alignment, uint32_t flags,
                                       const stream_ref& origin, allocation** out);
  /// A deallocation whose caller is capturing: a free node for a graph allocation of this
  /// capture; for earlier memory, a free deferred until the graph's life ends.
  arcpool_status_t deallocate_in_capture(allocation& a, const stream_ref& caller, bool force,
                                         bool implicit);
  /// UNSUPPORTED unless `s` captures in the same capture as `capturing` (which captures, and
  /// which arcpool created or registered, or names capture-scoped): transfers, use records and
  /// frees do not cross a capture's boundary.
  arcpool_status_t same_capture(const stream_ref& s, const stream_ref& capturing, const char* what);
  /// Captured edges from `a`'s current stream and use records' streams to `target`, all in one
  /// capture (checked first: a refusal enqueues nothing).
  arcpool_status_t edges_within_capture(allocation& a, const stream_ref& target, const char* what) {
    ARCPOOL_RETURN_IF_ERROR(all_within_capture(a, target, what));
    return capture_edges_to(a, target);
  }
  /// UNSUPPORTED unless `a`'s current stream and use records' streams capture in `target`'s
  /// capture; changes nothing.
  arcpool_status_t all_within_capture(allocation& a, const stream_ref& target, const char* what);
  /// The captured edges of edges_within_capture, checked already.
  arcpool_status_t capture_edges_to(allocation& a, const stream_ref& target);
  /// Orders later work on `to` after the work captured on `from` so far (both in one capture):
  /// a captured event record and wait, on an event never used again.
  arcpool_status_t capture_edge(stream_handle from, stream_handle to);
  /// Whether `s` captures now: one runtime call on the CUDA driver. A created or registered
  /// stream is asked under its liveness guard, so that its retirement (and its destruction)
  /// waits for the answer; once retired it is asked nothing (its handle may name another stream
  /// by now) and answers false: its final fence covers it. Any other stream is one the caller
  /// keeps alive (§6).
  arcpool_status_t stream_capturing(const stream_ref& s, bool* capturing) {
    *capturing = false;
    if (!s.entry) return driver_->stream_is_capturing(s.handle, capturing);
    const std::optional<arcpool_status_t> asked = s.entry->with_alive(
        [&](stream_handle h) { return driver_->stream_is_capturing(h, capturing); });
    return asked ? *asked : ARCPOOL_STATUS_SUCCESS;
  }
  /// UNSUPPORTED (naming `what`) when `s` is capturing (stream_capturing).
  arcpool_status_t check_not_capturing(const stream_ref& s, const char* what) {
    bool capturing = false;
    ARCPOOL_RETURN_IF_ERROR(stream_capturing(s, &capturing));
    return capturing ? capturing_failure(s, what) : ARCPOOL_STATUS_SUCCESS;
  }
  /// check_not_capturing of `h`, the handle of `s`, inside its liveness guard already.
  arcpool_status_t check_handle_not_capturing(stream_handle h, const stream_ref& s,
                                              const char* what) {
    bool capturing = false;
    ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(h, &capturing));
    return capturing ? capturing_failure(s, what) : ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t capturing_failure(const stream_ref& s, const char* what);
  /// UNSUPPORTED (naming `what`) when no fence taken now covers the work queued so far on
  /// `a`'s current stream: it was retired, or it is another thread's per-thread default stream.
  arcpool_status_t check_current_fenceable(const allocation& a, const char* what);
  /// Takes a fence on `s` (its final fence if it was retired).
  arcpool_status_t take_fence(const stream_ref& s, fence_ref* out);
  /// One fence for `s` into `out`: taken on it, or, for another thread's per-thread default
  /// stream (never touched from here), `a.current_fence` when `s` is the current stream.
  [[gnu::always_inline]] arcpool_status_t fence_stream(allocation& a, const stream_ref& s,
                                                       fence_list* out) {
    if (!s.reachable()) {
      // Its handle would name this thread's stream: the fence taken when it was named stands
      // for it (§6).
      if (a.current_fence && s.id == a.current.id) out->push_back(a.current_fence);
      return ARCPOOL_STATUS_SUCCESS;
    }
    fence_ref f;
    ARCPOOL_RETURN_IF_ERROR(take_fence(s, &f));
    out->push_back(std::move(f));
    return ARCPOOL_STATUS_SUCCESS;
  }
  /// `skip_id` of collect_fences that skips no stream.
  static constexpr uint64_t kSkipNone = UINT64_MAX;
  /// Fences every stream the allocation's memory may be used on: `caller` (if given), the
  /// current stream and every use record, once per stream, skipping stream `skip_id`. Another
  /// thread's per-thread default stream is never touched: `a.current_fence` stands for it.
  arcpool_status_t collect_fences(allocation& a, const stream_ref* caller, uint64_t skip_id,
                                  fence_list* out) {
    // The common case (a transfer, a free on another stream): no use records and no caller,
    // so the current stream is the one to fence.
    if (caller == nullptr && a.uses.empty()) {
      return a.current.id == skip_id ? ARCPOOL_STATUS_SUCCESS : fence_stream(a, a.current, out);
    }
    return collect_fences_of_uses(a, caller, skip_id, out);
  }
  /// collect_fences with a caller or use records (out of line).
  arcpool_status_t collect_fences_of_uses(allocation& a, const stream_ref* caller, uint64_t skip_id,
                                          fence_list* out);
  /// Makes `s` wait on every fence. `s` must be alive for the call.
  arcpool_status_t wait_all(stream_handle s, const fence_list& fences) {
    for (const fence_ref& f : fences) {
      ARCPOOL_RETURN_IF_ERROR(driver_->stream_wait_event(s, f->event()));
    }
    return ARCPOOL_STATUS_SUCCESS;
  }
  route choose_route(const allocation& a, const stream_ref& caller, uint32_t flags) const;
  /// Commits and enqueues a deallocation whose ownership check passed. `a.mutex` is held by
  /// `lock` and may be released before the reclaimer is fed.
  arcpool_status_t finish_deallocation(allocation& a, const stream_ref& caller, uint32_t flags,
                                       bool implicit, std::unique_lock<spinlock>& lock);
  /// finish_deallocation with the default routing on `a`'s current stream, which the caller
  /// did not name (a dropped last claim, an implicit free): a created or registered one is kept
  /// alive through it, so that a concurrent destroy or unregister waits (design.md §6); one
  /// retired first is fenced by its final fence.
  arcpool_status_t finish_on_current(allocation& a, bool implicit,
                                     std::unique_lock<spinlock>& lock);
  /// Makes `target` wait on `fences`, commits the deallocation (a failure so far changes
  /// nothing), clears the use records and frees on `target` (into `target_cache` when it keeps
  /// the block); counts the free, and `route_counter` once it succeeded. `*freed` (if given):
  /// whether the block was freed or cached, not written off (free_block).
  arcpool_status_t commit_and_free(allocation& a, const stream_ref& caller, bool force,
                                   bool implicit, stream_handle target, block_cache* target_cache,
                                   const fence_list& fences, stat::counter route_counter,
                                   bool* freed = nullptr);
  /// The end of commit_and_free, after the commit: the block goes to `target_cache` or back to
  /// the pool on `target` (the before-free hook first); counts it, and `route_counter` once it
  /// succeeded, through `st`. A pool free that finds no host memory writes the block off
  /// (counted, SUCCESS, `*freed` false).
  arcpool_status_t free_block(allocation& a, stream_handle target, block_cache* target_cache,
                              stat::counter route_counter, stats::local& st, bool* freed = nullptr);
  /// The fast path's cache of `s`: streams arcpool can prove alive and the legacy default
  /// stream; null when the cache is off or `s` has none.
  block_cache* cache_for(const stream_ref& s) noexcept {
    if (config_.stream_cache_bytes == 0) return nullptr;
    if (s.entry != nullptr) return &s.entry->cache();
    return s.kind == stream_kind::legacy_default ? &legacy_cache_ : nullptr;
  }
  /// Whether a block of an allocation of arcpool's own memory, of a determinate lifetime, may be
  /// cached (an indeterminate lifetime's block goes back through the reclaim worker).
  bool cacheable(size_t size, size_t alignment) const noexcept {
    return config_.stream_cache_bytes != 0 && size != 0 && size <= config_.stream_cache_max_block &&
           alignment <= ARCPOOL_DEFAULT_ALIGNMENT;
  }
  /// Gives the blocks of `cache` back to the pool on `s` (`close`: the stream is retiring);
  /// returns how many.
  size_t flush_cache(block_cache& cache, stream_handle s, bool close);
  /// Retires the known stream `ref` (`what`: the public call, for messages): its cache flushed
  /// and closed, its final fence recorded, its entry removed. On failure the stream stays as it
  /// was, its cache open again.
  arcpool_status_t retire_stream(const stream_ref& ref, const char* what);
  /// Gives the cached blocks of every live stream that is not capturing back to the pool
  /// (trim, out of memory, teardown); the legacy default stream's only with `include_legacy`.
  /// `synchronize`: waits until the frees ran, so that the pool can lend the blocks to any
  /// stream.
  void flush_caches(bool include_legacy, bool synchronize);
  /// Synchronizes every created or registered stream that is alive and not capturing, so that
  /// the frees queued on them ran and the host saw them complete (trim, out of memory). Holds
  /// no lock while it waits.
  void synchronize_known_streams();
  /// Adds to `out` a fence of `h`'s work so far, unless `h` captures (or its record fails, or
  /// finds no host memory): for wait_for_fences, once the locks that keep `h` alive are released.
  void fence_to_wait_for(stream_handle h, uint64_t id, fence_list* out) noexcept;
  /// Waits on the host until every fence of `fences` completed (failures ignored, as a
  /// synchronization's in a flush or a trim).
  void wait_for_fences(const fence_list& fences);
  /// Accepts the deallocation (ownership transition, stats, the log's free row on `stream`).
  arcpool_status_t commit(allocation& a, bool force, bool implicit, stream_handle stream);
  /// commit with the calling thread's stats shard, looked up by the caller.
  arcpool_status_t commit(allocation& a, bool force, bool implicit, stream_handle stream,
                          stats::local& st);
  /// What a commit tells once the deallocation is accepted: the allocation leaves the gauges,
  /// its stream's row, the log (a free row on `stream`), NVTX and the history.
  void forget(allocation& a, stream_handle stream, stats::local& st);
  /// A leaked allocation whose implicit free failed before its commit (its last reference is
  /// going): forgotten, its memory written off (left in the pool, no longer held; a graph pool's
  /// block stays reserved, and held, with its pool's bytes).
  void write_off_leaked(allocation& a) noexcept;
  arcpool_status_t allocate_from_pool(size_t bytes, size_t requested, const stream_ref& s,
                                      void** out);
  arcpool_status_t try_pool_allocate(size_t bytes, const stream_ref& s, void** out);
  /// The pool bytes that serve `size` at `alignment` (alignments above the pool's are
  /// over-allocated and aligned up); OUT_OF_MEMORY when that overflows.
  static arcpool_status_t padded_size(size_t size, size_t alignment, size_t* out);
  /// `p` aligned up to `alignment` (a power of two).
  static void* align_up(void* p, size_t alignment);
  /// allocate's cache hit: a block of exactly `size` bytes from `cache` (`origin`'s) and its
  /// record, built in place, for the thread whose state is `ts`. Null, with nothing changed,
  /// when the cache has no such block (or no record could be had). `Plain`: the fast path's,
  /// after fast_path_open (no observer to tell, the thread's own statistics shard).
  template <bool Plain>
  [[gnu::always_inline]] inline allocation* allocate_cached(thread_state& ts, block_cache& cache,
                                                            size_t size, size_t alignment,
                                                            const stream_ref& origin);
  /// Counts a new allocation of `size` bytes at `data` (block `base`, serial `serial`) on
  /// `origin`: its statistics through `st` and its stream's row (unless `row_counted`), and its
  /// entries in the log, the history and the NVTX tools. What both kinds of allocation do last,
  /// but for the fast path's hit (allocate_cached<true>).
  template <class Local>
  [[gnu::always_inline]] void count_allocation(const stream_ref& origin, void* base, void* data,
                                               size_t size, uint64_t serial, Local& st,
                                               bool cache_hit, bool row_counted);
  /// allocate without a cache hit: a block from the pool (none for zero bytes).
  arcpool_status_t allocate_uncached(size_t size, size_t alignment, uint32_t flags,
                                     const stream_ref& origin, allocation** out);
  /// The fast path's miss: a block for `p` (size and alignment set) from the pool.
  arcpool_status_t take_from_pool(allocation::params& p, stream_handle s);
  /// Gives the block of a failed allocation back to the pool on `s`.
  void give_back(const allocation::params& p, stream_handle s);
  /// The status (with message) of an ownership transition that did not happen; SUCCESS for
  /// one that did (inline: the fast path's transitions succeed).
  arcpool_status_t ownership_failure(const allocation& a, ownership_result r, const char* what) {
    return r == ownership_result::ok ? ARCPOOL_STATUS_SUCCESS
                                     : describe_ownership_failure(a, r, what);
  }
  arcpool_status_t describe_ownership_failure(const allocation& a, ownership_result r,
                                              const char* what);

  /// on_last_reference but for its common case: frees the memory of a leaked owner (live or
  /// unowned) or of an indeterminate lifetime, then destroys the record (out of line).
  [[gnu::noinline]] void free_at_last_reference(allocation* a) noexcept;

  /// The stream a stream-less call uses, and whether it must synchronize (under ambient_mutex_).
  arcpool_status_t ambient_stream(stream_handle* out, bool* synchronize);

  refcount refs_{1};
  live_count records_;                 ///< live allocation records, per thread shard
  std::atomic<bool> closing_{false};   ///< no handle left
  allocator* janitor_link_ = nullptr;  ///< under the janitor's lock
  const allocator_config config_;
  std::atomic<size_t> hard_limit_;  ///< bytes; 0: none (set_hard_limit changes it)
  const std::unique_ptr<driver> driver_;
  const bool notes_cache_moves_ = driver_->notes_cache_moves();  ///< driver::note_* to be called
  /// Nothing fixed at creation keeps the fast path closed (fast_path_open): the caches are on,
  /// and there is no history. (The before-free hook and the checker's cache notes are called
  /// on the fast path too, so that the suites, which set the hook, and the deterministic
  /// driver check it.)
  const bool plain_ = config_.stream_cache_bytes != 0 && config_.history_entries == 0;
  stats stats_;
  stream_stats_table stream_stats_;  ///< before streams_: the entries point into it
  event_pool events_;
  /// Captures bound to graph pools (slow path only: allocations on capturing streams).
  struct graph_binding {
    uint64_t capture;
    stream_handle begun_on;
    graph_pool* pool;  ///< compared only, once graph_gone (the pool may be gone too)
    bool graph_gone = false;
  };
  std::mutex graph_bindings_mutex_;
  std::vector<graph_binding> graph_bindings_;
  stream_registry streams_;
  history history_;  ///< before reclaimer_, which records into it
  reclaimer reclaimer_;
  block_cache legacy_cache_;  ///< the legacy default stream's fast path
  allocation_log log_;
  std::mutex ambient_mutex_;
  arcpool_ambient_policy_t ambient_policy_ = ARCPOOL_AMBIENT_LEGACY_DEFAULT;
  stream_handle ambient_bound_ = nullptr;
  stream_handle ambient_own_ = nullptr;  ///< created on first use by ARCPOOL_AMBIENT_SYNCHRONIZE
};

/// The C handle of an allocator is the allocator itself (arcpool_allocator is never defined).
inline allocator* from_handle(arcpool_allocator_t* a) noexcept {
  return reinterpret_cast<allocator*>(a);
}
inline const allocator* from_handle(const arcpool_allocator_t* a) noexcept {
  return reinterpret_cast<const allocator*>(a);
}
inline arcpool_allocator_t* to_handle(allocator* a) noexcept {
  return reinterpret_cast<arcpool_allocator_t*>(a);
}

}  // namespace arcpool::detail
