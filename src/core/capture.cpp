// Allocation and deallocation on streams capturing a CUDA graph (docs/graphs.md): graph
// allocation nodes, free nodes, and frees of earlier memory deferred to the graph's end.
#include <algorithm>
#include <atomic>
#include <new>
#include <thread>

#include "core/allocator.hpp"
#include "core/graph_pool.hpp"
#include "observe/nvtx.hpp"
#include "support/status.hpp"

namespace arcpool::detail {

/// A free of memory from before a capture, deferred until the graph's life ends: the driver
/// runs open() then (CUDA: a user object's destructor, on a runtime thread that may neither make
/// a CUDA call nor block), which posts the gate to the reclaim worker; the worker hands the item
/// to itself. The gate counts as a record of the allocator, which therefore outlives it.
struct graph_gate final : posted_task {
  graph_gate(allocator& a, std::unique_ptr<reclaim_item> i) : owner(a), item(std::move(i)) {
    run = &enqueue_item;
  }

  /// Whether the deallocation that armed the gate was accepted: its commit follows the arming
  /// (a failed arming must change nothing), and another owner's preserve can still refuse it.
  enum verdict : int { undecided, free_it, keep_it };

  allocator& owner;
  std::unique_ptr<reclaim_item> item;  ///< made at the deallocation: queueing it cannot fail
  std::atomic<int> decided{undecided};

  /// Said once by the deallocating thread, right after its commit; the gate is not touched
  /// after that (the worker may have deleted it).
  void decide(bool accepted) noexcept {
    decided.store(accepted ? free_it : keep_it, std::memory_order_release);
  }

  static void open(void* p) noexcept {
    auto* gate = static_cast<graph_gate*>(p);
    gate->owner.post_task(gate);
  }
  static void enqueue_item(posted_task* task) noexcept {
    auto* gate = static_cast<graph_gate*>(task);
    allocator& owner = gate->owner;
    // A graph destroyed at once: the deallocating thread is between its arming and its
    // commit, neither of which blocks.
    int verdict = undecided;
    while ((verdict = gate->decided.load(std::memory_order_acquire)) == undecided)
      std::this_thread::yield();
    if (verdict == free_it) owner.reclaimer_.enqueue(std::move(gate->item));
    delete gate;  // a refused deallocation's item goes with it, its fences released
    owner.record_destroyed();
  }
};

arcpool_status_t allocator::unknown_capturing_stream(stream_handle s) {
  return fail(ARCPOOL_STATUS_UNSUPPORTED,
              "stream %p is capturing a CUDA graph and is not one arcpool created or registered, "
              "and its capture is bound to none of this allocator's graph pools: arcpool "
              "identifies such a stream only by its registry (whether cudaStreamGetId is legal "
              "during capture is undocumented); create it with arcpool_stream_create or register "
              "it before the capture, or bind the capture to a graph pool "
              "(arcpool_graph_pool_begin)",
              static_cast<void*>(s));
}

arcpool_status_t allocator::resolve_capturing_stream(stream_handle s, stream_ref* out) {
  if (!driver_->supports_graphs()) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "stream %p is capturing a CUDA graph, and this driver builds no graphs",
                static_cast<void*>(s));
  }
  if (out->kind == stream_kind::application) {
    const uint64_t stamp = streams_.stamp();
    streams_.for_each([&](stream_entry& e) {
      if (e.handle() == s && e.alive()) out->entry = &e;
    });
    if (out->entry != nullptr) {
      out->id = out->entry->id();
      stream_cache_line_of(s) = stream_cache_line{stamp, s, out->id, out->entry, out->kind};
      return ARCPOOL_STATUS_SUCCESS;
    }
    // A stream the capture forked to: named by its handle while its capture is bound to one of
    // this allocator's graph pools, which was begun on a stream arcpool knows (its device was
    // checked then). Not cached: the identity lasts for this capture only.
    capture_info capture;
    ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(s, &capture));
    if (bound_pool(capture.id) != nullptr) {
      out->id = capture_scoped_id(s);
      return ARCPOOL_STATUS_SUCCESS;
    }
  }
  return unknown_capturing_stream(s);
}

arcpool_status_t allocator::allocate_in_capture(size_t size, size_t alignment, uint32_t flags,
                                                const stream_ref& origin, allocation** out) {
  if (!driver_->supports_graphs()) return capturing_failure(origin, "allocate");
  // A stream this thread resolved before (a per-thread default stream, whose capture
  // resolve_capturing_stream refuses) reaches here from its stream cache line.
  if (!origin.entry && !origin.capture_scoped()) return unknown_capturing_stream(origin.handle);
  if (flags != 0) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "allocate on capturing stream %p: flags 0x%x (an indeterminate lifetime) cannot "
                "be given to a graph allocation, whose life the graph bounds",
                static_cast<void*>(origin.handle), flags);
  }
  capture_info capture;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(origin.handle, &capture));
  allocation::params p;
  p.origin = origin;
  p.placement_flags = ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS | ARCPOOL_PLACEMENT_FLAG_GRAPH;
  p.size = size;
  p.alignment = alignment;
  size_t padded = 0;
  ARCPOOL_RETURN_IF_ERROR(padded_size(size, alignment, &padded));
  // No stream cache either way (p.cacheable stays false): a cached block would be pool memory
  // inside the graph, or graph memory lent outside it.
  graph_pool* lender = size != 0 ? bound_pool(capture.id) : nullptr;
  graph_pool::tag lent_from;  // where the block may be lent again, were it given back now
  if (lender != nullptr) {
    // A graph pool's block: pool memory reserved outside the capture.
    ARCPOOL_RETURN_IF_ERROR(
        lender->take(padded, capture.id, origin.id, &p.base, &p.held_bytes, &lent_from));
    p.placement_flags = ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS | ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL;
    p.made_by.lender = lender;
    lender->retain();
  } else {
    // A graph allocation node. No hard limit and no out-of-memory retry: it is the graph's. It
    // takes its parameters from the pool (cudaMallocFromPoolAsync: "The memory pool's
    // properties are used to set the node's creation parameters"), and a node's "handleTypes
    // must be cudaMemHandleTypeNone. IPC is not supported" (cudaMemAllocNodeParams).
    if (size != 0 && config_.driver.ipc_handle_types != 0) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "allocate on capturing stream %p: this allocator's pool is shareable between "
                  "processes (ipc_handle_types 0x%x), and CUDA's graph allocations support no "
                  "IPC; allocate from a graph pool (arcpool_graph_pool_create), or from an "
                  "allocator without IPC handle types",
                  static_cast<void*>(origin.handle), config_.driver.ipc_handle_types);
    }
    p.made_by.capture_id = capture.id;
    if (size != 0) {
      p.held_bytes = padded;
      ARCPOOL_RETURN_IF_ERROR(driver_->pool_allocate(p.held_bytes, origin.handle, &p.base));
    }
  }
  p.data = align_up(p.base, alignment);
  allocation* a = new (std::nothrow) allocation(*this, p);
  if (a == nullptr) {
    if (lender != nullptr) {
      // Its fences completed before it was lent (graph_pool::take): none to keep.
      lender->give(p.base, p.held_bytes, lent_from, fence_list());
      lender->release();
    } else if (p.base != nullptr) {
      driver_->pool_free(p.base, p.held_bytes, origin.handle);
    }
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an allocation record");
  }
  record_created();
  stats::local st = stats_.here();
  st.count(stat::allocations);
  st.count(stat::graph_allocations);
  stream_stats_of(origin).allocated_in_graph();
  st.add(stat::graph_bytes_in_use, static_cast<int64_t>(size));
  if (log_.enabled()) log_.write("allocate", p.data, size, origin.handle);
  nvtx::name_region(p.data, size, a->placement.serial);
  *out = a;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::same_capture(const stream_ref& s, const stream_ref& capturing,
                                         const char* what) {
  if (!driver_->supports_graphs()) return capturing_failure(capturing, what);
  if (!capturing.entry && !capturing.capture_scoped()) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "%s: capturing stream %p is not one arcpool created or registered", what,
                static_cast<void*>(capturing.handle));
  }
  capture_info target;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(capturing.handle, &target));
  bool also = false;
  if (s.reachable() && !s.retired()) ARCPOOL_RETURN_IF_ERROR(stream_capturing(s, &also));
  capture_info other;
  if (also) ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(s.handle, &other));
  if (!also || other.id != target.id) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "%s across a capture's boundary: stream %p is capturing a graph and stream %p %s; "
                "arcpool refuses it (cudaEventWaitExternal would wait at each launch for the "
                "event's state then, not for the stream's work up to this call)",
                what, static_cast<void*>(capturing.handle), static_cast<void*>(s.handle),
                also ? "is capturing another" : "is not capturing");
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::all_within_capture(allocation& a, const stream_ref& target,
                                               const char* what) {
  ARCPOOL_RETURN_IF_ERROR(same_capture(a.current, target, what));
  for (const use_record& u : a.uses) {
    if (!u.at_deallocation && u.stream.reachable()) {
      // Fenced when it was recorded: the stream may be gone since (arcpool_record_use), so it
      // is asked nothing, and a fence from outside the capture orders none of its nodes.
      return fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "%s of %s during a capture: stream %p used it, and arcpool neither created nor "
                  "registered it (its use was recorded without "
                  "ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION), so arcpool cannot ask "
                  "whether it captures: it may be gone",
                  what, a.describe().c_str(), static_cast<void*>(u.stream.handle));
    }
    ARCPOOL_RETURN_IF_ERROR(same_capture(u.stream, target, what));
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::capture_edges_to(allocation& a, const stream_ref& target) {
  if (a.current.id != target.id) {
    ARCPOOL_RETURN_IF_ERROR(capture_edge(a.current.handle, target.handle));
  }
  for (const use_record& u : a.uses) {
    if (u.stream.id != target.id)
      ARCPOOL_RETURN_IF_ERROR(capture_edge(u.stream.handle, target.handle));
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::capture_edge(stream_handle from, stream_handle to) {
  event_handle e = nullptr;
  ARCPOOL_RETURN_IF_ERROR(driver_->event_create(&e));
  arcpool_status_t status = driver_->event_record(e, from);
  if (status == ARCPOOL_STATUS_SUCCESS) status = driver_->stream_wait_event(to, e);
  driver_->event_destroy(e);
  return status;
}

arcpool_status_t allocator::deallocate_in_capture(allocation& a, const stream_ref& caller,
                                                  bool force, bool implicit) {
  if (!driver_->supports_graphs()) return capturing_failure(caller, "deallocate");
  capture_info capture;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(caller.handle, &capture));
  if (a.graph()) {
    if (a.placement.made_by.capture_id != capture.id) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "deallocate of %s on stream %p: it is graph memory of capture %llu, and the "
                  "stream captures %llu; graph memory is freed in its own capture or outside "
                  "every capture, after a launch",
                  a.describe().c_str(), static_cast<void*>(caller.handle),
                  static_cast<unsigned long long>(a.placement.made_by.capture_id),
                  static_cast<unsigned long long>(capture.id));
    }
    // Graph memory is used only inside its capture: the current stream and the use records'
    // streams capture in it, and captured edges order the free node after their work.
    ARCPOOL_RETURN_IF_ERROR(edges_within_capture(a, caller, "deallocate"));
    stats::local st = stats_.here();
    ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle, st));
    a.uses.clear();
    // A free node; only a broken context fails here, after the commit.
    const arcpool_status_t status =
        a.placement.size == 0
            ? ARCPOOL_STATUS_SUCCESS
            : driver_->pool_free(a.placement.base, a.placement.held_bytes, caller.handle);
    st.count(status == ARCPOOL_STATUS_SUCCESS ? stat::graph_frees : stat::reclaim_failures);
    return status;
  }

  // Memory from before the capture: the graph may use it at every launch, so its free waits
  // for the graph's end, then for the streams' work. Streams not capturing are fenced now;
  // capturing ones (the caller, another stream of a capture) once the graph is gone, which
  // needs arcpool to prove them alive then: created or registered streams only.
  std::unique_ptr<reclaim_item> item = reclaimer_.prepare();
  item->counted_on = &stream_stats_of(a.placement.origin);
  small_vector<uint64_t, 8> seen;
  auto add = [&](const stream_ref& s, const fence_ref* recorded) -> arcpool_status_t {
    if (s.retired()) {
      // Its final fence; apart from the id seen-list, as in collect_fences_of_uses: the stream,
      // registered again, may have a live entry of the same id (a use record's).
      item->fences.push_back(s.entry->final_fence());
      return ARCPOOL_STATUS_SUCCESS;
    }
    for (uint64_t id : seen)
      if (id == s.id) return ARCPOOL_STATUS_SUCCESS;
    seen.push_back(s.id);
    if (!s.reachable()) {
      // Another thread's per-thread default stream: the fence taken when arcpool last saw it
      // (a use record's, or the current stream's), as outside capture (collect_fences_of_uses).
      if (recorded != nullptr) {
        item->fences.push_back(*recorded);
      } else if (a.current_fence && s.id == a.current.id) {
        item->fences.push_back(a.current_fence);
      }
      return ARCPOOL_STATUS_SUCCESS;
    }
    if (recorded != nullptr) {
      // A use fenced when it was recorded, outside this capture: the stream may be gone now
      // (arcpool_record_use), so it is not asked anything, as outside a capture.
      item->fences.push_back(*recorded);
      return ARCPOOL_STATUS_SUCCESS;
    }
    bool capturing = true;
    if (s.id != caller.id) ARCPOOL_RETURN_IF_ERROR(stream_capturing(s, &capturing));
    if (capturing) {
      if (!s.entry) {
        return fail(ARCPOOL_STATUS_UNSUPPORTED,
                    "deallocate of %s during a capture: stream %p captures and is not one arcpool "
                    "created or registered, so arcpool cannot fence it after the graph's end",
                    a.describe().c_str(), static_cast<void*>(s.handle));
      }
      if (s.id != caller.id) {
        // Another capture's graph may use the memory at each of its launches, and arcpool can
        // order the free after none of them (as a transfer across captures is refused).
        capture_info theirs;
        ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(s.handle, &theirs));
        if (theirs.id != capture.id) {
          return fail(ARCPOOL_STATUS_UNSUPPORTED,
                      "deallocate of %s on stream %p: stream %p, which may use it, captures "
                      "another graph, whose launches arcpool cannot order the free after",
                      a.describe().c_str(), static_cast<void*>(caller.handle),
                      static_cast<void*>(s.handle));
        }
      }
      item->fence_later.push_back(s);
      return ARCPOOL_STATUS_SUCCESS;
    }
    fence_ref f;
    ARCPOOL_RETURN_IF_ERROR(take_fence(s, &f));
    item->fences.push_back(std::move(f));
    return ARCPOOL_STATUS_SUCCESS;
  };
  ARCPOOL_RETURN_IF_ERROR(add(caller, nullptr));
  ARCPOOL_RETURN_IF_ERROR(add(a.current, nullptr));
  for (const use_record& u : a.uses) {
    const bool now = u.at_deallocation && u.stream.reachable();
    ARCPOOL_RETURN_IF_ERROR(add(u.stream, now ? nullptr : &u.fence));
  }
  // Room for the fences the worker takes of the streams capturing now, so that it takes them
  // without allocating (on the worker, a failure could only give the memory up).
  item->fences.reserve(item->fences.size() + item->fence_later.size());
  prepare_posted_task();  // started by the item's prepare already; may throw: before the commit
  // Freed on the reclaim worker's own stream, never on the origin: a stream that captured
  // once may capture again whenever its thread likes, and a free enqueued then would land in
  // that capture's graph (the fences make the free follow the streams' work).
  item->pointer = a.placement.base;
  item->bytes = a.placement.held_bytes;
  auto* gate = new (std::nothrow) graph_gate(*this, std::move(item));
  if (gate == nullptr) return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a free");
  // The ownership change follows the one call that can fail, so that a failed defer leaves the
  // allocation as it was. The change can still be refused (a preserve takes no lock: another
  // reference's holder may add an owner meanwhile); the armed gate then frees nothing. The
  // allocator may have no handle left (its janitor summing the records now): a is live.
  record_created_through_a_record();
  if (arcpool_status_t status = driver_->graph_defer(capture.graph, &graph_gate::open, gate);
      status != ARCPOOL_STATUS_SUCCESS) {
    delete gate;
    record_destroyed();
    return status;
  }
  await_posted_task();
  const arcpool_status_t status = commit(a, force, implicit, caller.handle);
  gate->decide(status == ARCPOOL_STATUS_SUCCESS);
  if (status != ARCPOOL_STATUS_SUCCESS) return status;
  a.uses.clear();
  stats_.count(stat::graph_deferred_frees);
  return ARCPOOL_STATUS_SUCCESS;
}

graph_pool* allocator::bound_pool(uint64_t capture) {
  std::lock_guard<std::mutex> lock(graph_bindings_mutex_);
  for (const graph_binding& b : graph_bindings_)
    if (b.capture == capture && !b.graph_gone) return b.pool;
  return nullptr;
}

arcpool_status_t allocator::return_to_graph_pool(allocation& a, const stream_ref& caller,
                                                 bool force, bool implicit) {
  graph_pool::tag where;
  fence_list fences;
  bool capturing = false;
  if (!caller.retired() && caller.reachable()) {
    ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(caller.handle, &capturing));
  }
  if (capturing) {
    // Lent again only on this stream in this capture: stream order puts those allocations
    // after this point, and captured edges put this point after the block's other streams.
    capture_info capture;
    ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(caller.handle, &capture));
    // Every check before the pool is told anything: a refusal changes nothing.
    ARCPOOL_RETURN_IF_ERROR(all_within_capture(a, caller, "deallocate"));
    if (!a.lender()->hears_of(capture.id)) {
      // Only a capture bound to the pool tells it when its graph is gone: in another, the
      // block would stay tagged with that capture, lent to no one, and at the pool's release go
      // back to the allocator's pool while that graph, which may use it, lives on. The pool is
      // told of this graph's end as of a binding's (lending the capture nothing), and holds
      // the block until then: frameworks' free hooks cannot take a refusal, and a dropped last
      // reference cannot be refused. Where it cannot be told, a free fails with nothing
      // changed (a dropped last reference writes the block off: free_at_last_reference).
      prepare_posted_task();  // may throw (no host memory, no thread): before anything changes
      ARCPOOL_RETURN_IF_ERROR(tell_pool_of_graph_end(*a.lender(), capture));
    }
    ARCPOOL_RETURN_IF_ERROR(capture_edges_to(a, caller));
    where = graph_pool::tag{capture.id, caller.id};
  } else {
    // Outside captures: the pool's final release waits for these uses.
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, kSkipNone, &fences));
  }
  stats::local st = stats_.here();
  ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle, st));
  a.uses.clear();
  if (capturing) st.count(stat::graph_frees);
  graph_pool* lender = a.lender();
  lender->give(a.placement.base, a.placement.held_bytes, where, std::move(fences));
  lender->release();
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::create_graph_pool(graph_pool** out) {
  if (!driver_->supports_graphs()) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "graph pools need the CUDA driver (this one builds "
                "no graphs)");
  }
  graph_pool* pool = new (std::nothrow) graph_pool(*this);
  if (pool == nullptr) return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a pool");
  *out = pool;
  return ARCPOOL_STATUS_SUCCESS;
}

namespace {

/// A capture bound to a graph pool: when the capture's graph is gone (a user object's
/// destructor, which posts the gate to the reclaim worker), its binding goes, its freed blocks
/// become free for any bound capture, and the pool loses the capture's reference.
struct capture_binding_gate final : posted_task {
  capture_binding_gate(graph_pool& p, uint64_t c) : pool(&p), capture(c) { run = &end_binding; }

  graph_pool* pool;
  uint64_t capture;

  static void open(void* p) noexcept {
    auto* gate = static_cast<capture_binding_gate*>(p);
    gate->pool->owner().post_task(gate);
  }
  static void end_binding(posted_task* task) noexcept {
    auto* gate = static_cast<capture_binding_gate*>(task);
    gate->pool->owner().capture_graph_gone(gate->capture);
    gate->pool->capture_ended(gate->capture);
    gate->pool->release();
    delete gate;
  }
};

}  // namespace

arcpool_status_t allocator::begin_graph_pool(graph_pool& pool, stream_handle s) {
  if (&pool.owner() != this) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "the graph pool belongs to another allocator");
  }
  stream_ref ref;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &ref));
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s, &capturing));
  if (!capturing) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "graph pool begin: stream %p is not capturing a graph", static_cast<void*>(s));
  }
  capture_info capture;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_capture_info(s, &capture));
  prepare_posted_task();  // may throw: before anything changes
  {
    std::lock_guard<std::mutex> lock(graph_bindings_mutex_);
    for (const graph_binding& b : graph_bindings_) {
      if (b.capture == capture.id) {
        return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                    "graph pool begin: the capture of stream %p is bound to a graph pool already",
                    static_cast<void*>(s));
      }
    }
    graph_bindings_.push_back(graph_binding{capture.id, s, &pool, false});
  }
  const arcpool_status_t status = tell_pool_of_graph_end(pool, capture);
  if (status != ARCPOOL_STATUS_SUCCESS) unbind_capture(capture.id);
  return status;
}

arcpool_status_t allocator::tell_pool_of_graph_end(graph_pool& pool, const capture_info& capture) {
  auto* gate = new (std::nothrow) capture_binding_gate(pool, capture.id);
  arcpool_status_t status =
      gate == nullptr ? fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a graph's gate")
                      : pool.capture_bound(capture.id);
  if (status == ARCPOOL_STATUS_SUCCESS) {
    pool.retain();  // the gate's, released when the graph is gone
    status = driver_->graph_defer(capture.graph, &capture_binding_gate::open, gate);
    if (status == ARCPOOL_STATUS_SUCCESS) {
      await_posted_task();
      return status;
    }
    pool.capture_unbound(capture.id);
    pool.release();
  }
  delete gate;
  return status;
}

arcpool_status_t allocator::end_graph_pool(graph_pool& pool, stream_handle s) {
  std::lock_guard<std::mutex> lock(graph_bindings_mutex_);
  const auto bound = [&](const graph_binding& b) { return b.pool == &pool && b.begun_on == s; };
  const auto it = std::remove_if(graph_bindings_.begin(), graph_bindings_.end(), bound);
  if (it == graph_bindings_.end()) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "graph pool end: no capture was begun on stream %p with this pool",
                static_cast<void*>(s));
  }
  graph_bindings_.erase(it, graph_bindings_.end());
  return ARCPOOL_STATUS_SUCCESS;
}

void allocator::capture_graph_gone(uint64_t capture) noexcept {
  std::lock_guard<std::mutex> lock(graph_bindings_mutex_);
  for (graph_binding& b : graph_bindings_)
    if (b.capture == capture) b.graph_gone = true;
}

void allocator::unbind_capture(uint64_t capture) noexcept {
  std::lock_guard<std::mutex> lock(graph_bindings_mutex_);
  graph_bindings_.erase(
      std::remove_if(graph_bindings_.begin(), graph_bindings_.end(),
                     [&](const graph_binding& b) { return b.capture == capture; }),
      graph_bindings_.end());
}

}  // namespace arcpool::detail
