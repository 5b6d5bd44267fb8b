// Deallocation (design.md §3, §4): fences, ownership transitions, the choice of route and
// where the free runs, and the last reference.
#include <new>

#include "core/allocator.hpp"
#include "core/graph_pool.hpp"
#include "observe/nvtx.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

constexpr uint32_t kRoutingFlags = ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE |
                                   ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN |
                                   ARCPOOL_DEALLOCATE_FLAG_DEFERRED;
constexpr uint32_t kDeallocateFlags = ARCPOOL_DEALLOCATE_FLAG_FORCE | kRoutingFlags;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Fences

arcpool_status_t allocator::take_fence(const stream_ref& s, fence_ref* out) {
  const shard_slot slot = thread_shard();  // for the event pool and the count
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  if (s.entry) {
    // A created or registered stream: enqueue only while provably alive; once retired, its
    // final fence covers everything that was queued on it.
    const std::optional<arcpool_status_t> recorded = s.entry->with_alive([&](stream_handle h) {
      ARCPOOL_RETURN_IF_ERROR(check_handle_not_capturing(h, s, "fence"));
      return events_.record(h, s.id, out, slot);
    });
    if (!recorded) {
      *out = s.entry->final_fence();
      return ARCPOOL_STATUS_SUCCESS;
    }
    status = *recorded;
  } else {
    // Passed in this call, or the current stream, which the caller keeps alive (§6).
    ARCPOOL_RETURN_IF_ERROR(check_not_capturing(s, "fence"));
    status = events_.record(s.handle, s.id, out, slot);
  }
  if (status == ARCPOOL_STATUS_SUCCESS) stats_.at(slot).count(stat::fences_taken);
  return status;
}

arcpool_status_t allocator::collect_fences_of_uses(allocation& a, const stream_ref* caller,
                                                   uint64_t skip_id, fence_list* out) {
  small_vector<uint64_t, 8> seen;
  if (skip_id != kSkipNone) seen.push_back(skip_id);
  // A stream once per id, but a retired one apart: its final fence covers nothing queued since,
  // and the stream, registered again, has a live entry of the same id (a use record's) that
  // must be fenced too.
  auto fresh = [&seen, skip_id](const stream_ref& s) {
    if (s.retired()) return s.id != skip_id;
    for (uint64_t id : seen) {
      if (id == s.id) return false;
    }
    seen.push_back(s.id);
    return true;
  };
  if (caller != nullptr && fresh(*caller)) ARCPOOL_RETURN_IF_ERROR(fence_stream(a, *caller, out));
  if (fresh(a.current)) ARCPOOL_RETURN_IF_ERROR(fence_stream(a, a.current, out));
  for (const use_record& u : a.uses) {
    if (u.at_deallocation && u.stream.reachable()) {
      if (fresh(u.stream)) ARCPOOL_RETURN_IF_ERROR(fence_stream(a, u.stream, out));
    } else if (fresh(u.stream)) {
      out->push_back(u.fence);
    }
  }
  return ARCPOOL_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Ownership

arcpool_status_t allocator::describe_ownership_failure(const allocation& a, ownership_result r,
                                                       const char* what) {
  switch (r) {
    case ownership_result::ok:
      return ARCPOOL_STATUS_SUCCESS;
    case ownership_result::not_owner: {
      const ownership::snapshot s = a.owners.load();
      return fail(ARCPOOL_STATUS_NOT_OWNER, "%s of %s: %s", what, a.describe().c_str(),
                  s.owners == 0 ? "owner count is 0 (the last owner discarded)"
                                : "other owners remain (use FORCE to override)");
    }
    case ownership_result::already_deallocated: {
      const bool exported = a.owners.load().st == ARCPOOL_ALLOCATION_EXPORTED;
      return fail(ARCPOOL_STATUS_ALREADY_DEALLOCATED, "%s of %s: it was already %s", what,
                  a.describe().c_str(), exported ? "exported" : "deallocated");
    }
    case ownership_result::overflow:
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "%s of %s: owner count overflow", what,
                  a.describe().c_str());
  }
  return ARCPOOL_STATUS_INVALID_ARGUMENT;
}

// ---------------------------------------------------------------------------------------------
// Deallocation (design.md §4)

allocator::route allocator::choose_route(const allocation& a, const stream_ref& caller,
                                         uint32_t flags) const {
  if (flags & ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE) return route::wait_and_free;
  if (flags & ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN) return route::prefer_origin;
  if (flags & ARCPOOL_DEALLOCATE_FLAG_DEFERRED) return route::deferred;
  if (a.uses.empty() && caller.id == a.placement.origin.id && a.current.id == caller.id) {
    return route::same_stream;
  }
  switch (a.uses.empty() ? config_.foreign_stream_routing : config_.use_record_routing) {
    case ARCPOOL_ROUTING_WAIT_AND_FREE:
      return route::wait_and_free;
    case ARCPOOL_ROUTING_PREFER_ORIGIN:
      return route::prefer_origin;
    default:
      return route::deferred;
  }
}

arcpool_status_t allocator::commit(allocation& a, bool force, bool implicit, stream_handle stream) {
  stats::local st = stats_.here();
  return commit(a, force, implicit, stream, st);
}

arcpool_status_t allocator::commit(allocation& a, bool force, bool implicit, stream_handle stream,
                                   stats::local& st) {
  if (implicit) {
    if (!a.owners.accept_implicit_free()) {
      return ownership_failure(a, ownership_result::already_deallocated, "implicit free");
    }
  } else {
    ARCPOOL_RETURN_IF_ERROR(
        ownership_failure(a, a.owners.accept_deallocation(force), "deallocate"));
  }
  st.count(implicit ? stat::implicit_frees : stat::deallocations);
  forget(a, stream, st);
  return ARCPOOL_STATUS_SUCCESS;
}

void allocator::forget(allocation& a, stream_handle stream, stats::local& st) {
  if (a.current_fence) a.current_fence = fence_ref();  // its fences were collected already
  // An import's memory was neither logged nor named here (its own allocator may name it).
  if (!a.external()) {
    if (log_.enabled()) log_.write("free", a.placement.data, a.placement.size, stream);
    nvtx::forget_region(a.placement.data);
  }
  if (a.made_in_capture()) {
    st.sub(stat::graph_bytes_in_use, static_cast<int64_t>(a.placement.size));
  } else if (!a.external()) {
    st.sub(stat::bytes_in_use, static_cast<int64_t>(a.placement.size));
    st.sub(stat::allocations_in_use, 1);
    stream_stats_of(a.placement.origin).freed(a.placement.size);
    if (history_.enabled()) history_.free_requested(a.placement.base, stream);
  }
}

void allocator::write_off_leaked(allocation& a) noexcept {
  stats::local st = stats_.here();
  forget(a, a.current.handle, st);
  // Nothing of the pool's; or graph memory, not in bytes_held, or a graph pool's block, which
  // stays reserved in its pool's bytes (part of bytes_held) until the allocator goes.
  if (a.external() || a.placement.size == 0 || a.made_in_capture()) return;
  if (history_.enabled()) history_.segment_free(a.placement.base, a.current.handle);
  st.sub(stat::bytes_held, static_cast<int64_t>(a.placement.held_bytes));
}

arcpool_status_t allocator::commit_and_free(allocation& a, const stream_ref& caller, bool force,
                                            bool implicit, stream_handle target,
                                            block_cache* target_cache, const fence_list& fences,
                                            stat::counter route_counter, bool* freed) {
  // The waits first: if one fails nothing has changed (a wait is harmless if the commit then
  // fails).
  if (!fences.empty()) ARCPOOL_RETURN_IF_ERROR(wait_all(target, fences));
  stats::local st = stats_.here();
  ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle, st));
  if (!a.uses.empty()) a.uses.clear();
  return free_block(a, target, target_cache, route_counter, st, freed);
}

arcpool_status_t allocator::free_block(allocation& a, stream_handle target,
                                       block_cache* target_cache, stat::counter route_counter,
                                       stats::local& st, bool* freed) {
  if (config_.before_free != nullptr) {
    run_before_free(*driver_, config_.before_free, config_.before_free_user_data, a.placement.base,
                    a.placement.held_bytes, target);
  }
  // Every wait the block needs is enqueued on `target`: its cache may keep it (§4) if its size
  // and alignment allow (graph memory never: it is never lent as pool memory).
  // The history learns of a block's return before another thread can be handed it.
  const bool recording = history_.enabled();
  if (target_cache != nullptr && a.placement.cacheable) {
    if (recording) history_.free_completed(a.placement.base, target);
    if (target_cache->put_if(a.placement.base, a.placement.held_bytes, config_.stream_cache_bytes,
                             [](const spinlock&) { return true; })) {
      st.count(route_counter == stat::same_stream_frees ? stat::cached_same_stream_frees
                                                        : stat::cached_cross_stream_frees);
      st.add(stat::bytes_cached, static_cast<int64_t>(a.placement.held_bytes));
      if (notes_cache_moves_)
        driver_->note_release(a.placement.base, a.placement.held_bytes, target);
      if (freed != nullptr) *freed = true;
      return ARCPOOL_STATUS_SUCCESS;
    }
  }
  if (recording) history_.segment_free(a.placement.base, target);
  // Only a broken context fails here, after the commit: the block is then lost with it. The
  // host driver queues the free as host work, which may find no host memory: the block is
  // written off then, and the free stands. Either is counted, as at a flush or in the reclaimer.
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  bool queued = true;
  try {
    status = driver_->pool_free(a.placement.base, a.placement.held_bytes, target);
  } catch (const std::bad_alloc&) {
    queued = false;
  }
  const bool given_back = queued && status == ARCPOOL_STATUS_SUCCESS;
  if (freed != nullptr) *freed = given_back;
  if (!a.graph()) st.sub(stat::bytes_held, static_cast<int64_t>(a.placement.held_bytes));
  if (given_back) {
    st.count(stat::frees);
    st.count(route_counter);
  } else {
    st.count(stat::reclaim_failures);
  }
  return status;
}

arcpool_status_t allocator::finish_deallocation(allocation& a, const stream_ref& caller,
                                                uint32_t flags, bool implicit,
                                                std::unique_lock<spinlock>& lock) {
  const bool force = flags & ARCPOOL_DEALLOCATE_FLAG_FORCE;
  fence_list fences;

  // Nothing to give back: zero bytes of arcpool's, or a borrowed import nobody wants to hear
  // about. (An import with on_free hears about it even at zero bytes.)
  if (a.external() ? a.placement.on_free == nullptr : a.placement.size == 0) {
    ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
    a.uses.clear();
    return ARCPOOL_STATUS_SUCCESS;
  }

  // A graph pool's block goes back to its pool, never to the allocator's.
  if (a.lender() != nullptr) return return_to_graph_pool(a, caller, force, implicit);

  // Indeterminate lifetime: take the fences now, free nothing until the last reference goes.
  // The deferred free is made now, while the call can still fail: the last reference may not.
  if (a.indeterminate()) {
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, kSkipNone, &fences));
    std::unique_ptr<reclaim_item> item = reclaimer_.prepare();
    ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
    stats_.count(stat::ignored_deallocations);
    item->fences = std::move(fences);
    a.deferred_free = item.release();
    a.uses.clear();
    return ARCPOOL_STATUS_SUCCESS;
  }

  // Imported memory: on_free runs on the reclaim worker once every fence completed.
  if (a.external()) {
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, kSkipNone, &fences));
    std::unique_ptr<reclaim_item> item = reclaimer_.prepare();  // before the commit: see there
    ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
    item->pointer = a.placement.base;
    item->bytes = a.placement.size;
    item->fences = std::move(fences);
    item->on_free = a.placement.on_free;
    item->on_free_user_data = a.placement.on_free_user_data;
    item->counted_on = &stream_stats_of(a.placement.origin);
    a.uses.clear();
    lock.unlock();
    reclaimer_.enqueue(std::move(item));
    return ARCPOOL_STATUS_SUCCESS;
  }

  // A retired current stream cannot be enqueued on: its final fence goes to the reclaimer.
  // An implicit free's caller is the current stream, so it may be retired too, or be another
  // thread's per-thread default stream (never touched from here, §6): then nothing is enqueued
  // on it and the reclaimer frees once its fences completed. Every other route fences or frees
  // on the caller's stream.
  const bool caller_usable = !caller.retired() && caller.reachable();
  if (caller_usable) {
    bool capturing = false;
    ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(caller.handle, &capturing));
    if (capturing) return deallocate_in_capture(a, caller, force, implicit);
  }
  route r =
      a.current.retired() || !caller_usable ? route::deferred : choose_route(a, caller, flags);
  const stream_ref& origin = a.placement.origin;
  // A routing flag may take a free involving no other stream off the same-stream route: it
  // still counts as the origin's own free, not a cross-stream one.
  const bool cross_stream = !a.uses.empty() || caller.id != origin.id || a.current.id != caller.id;

  if (r == route::same_stream) {
    return commit_and_free(a, caller, force, implicit, caller.handle, cache_for(caller), fences,
                           stat::same_stream_frees);
  }

  bool fell_back = false;  // counted once the fallback freed
  if (r == route::prefer_origin && origin.id != caller.id) {
    if (origin.provably_alive()) {
      ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, origin.id, &fences));
      // The origin stays alive for the whole call: waits, commit and free. An origin capturing
      // a graph cannot take the free (it would be a node of that graph): the caller's stream
      // does, as for an origin not provably alive.
      bool origin_capturing = false;
      const std::optional<arcpool_status_t> freed = origin.entry->with_alive([&](stream_handle h) {
        ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(h, &origin_capturing));
        if (origin_capturing) return ARCPOOL_STATUS_SUCCESS;
        bool routed = false;
        ARCPOOL_RETURN_IF_ERROR(commit_and_free(a, caller, force, implicit, h, cache_for(origin),
                                                fences, stat::cross_stream_frees, &routed));
        if (routed) {  // counted as the total is: not a free written off
          stream_stats_of(origin).cross_stream_free();
          stats_.count(stat::origin_routed_frees);
        }
        return ARCPOOL_STATUS_SUCCESS;
      });
      if (freed && !origin_capturing) return *freed;
      // Retired since the check, or capturing: fence again (the origin's final fence among
      // them, if it is the current stream) and free on the caller's stream.
      fences.clear();
    }
    fell_back = true;
    r = route::wait_and_free;
  }

  if (r == route::wait_and_free || r == route::prefer_origin) {
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, nullptr, caller.id, &fences));
    bool freed = false;
    ARCPOOL_RETURN_IF_ERROR(
        commit_and_free(a, caller, force, implicit, caller.handle, cache_for(caller), fences,
                        cross_stream ? stat::cross_stream_frees : stat::same_stream_frees, &freed));
    if (cross_stream && freed) stream_stats_of(origin).cross_stream_free();
    if (fell_back && freed) stats_.count(stat::origin_fallbacks);
    return ARCPOOL_STATUS_SUCCESS;
  }

  // Deferred: fence everything, let the reclaim worker free on the origin once all completed.
  // The item is made before the commit: without host memory the call fails and changes
  // nothing, where a failed queueing after it would lose the memory.
  ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, kSkipNone, &fences));
  std::unique_ptr<reclaim_item> item = reclaimer_.prepare();
  ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
  if (cross_stream) {
    stats_.count(stat::cross_stream_frees);
    stream_stats_of(origin).cross_stream_free();
  }
  item->pointer = a.placement.base;
  item->bytes = a.placement.held_bytes;
  item->fences = std::move(fences);
  item->origin = origin;
  item->counted_on = &stream_stats_of(origin);
  item->routed_to_origin = cross_stream;
  item->graph = a.graph();
  a.uses.clear();
  lock.unlock();
  reclaimer_.enqueue(std::move(item));
  return ARCPOOL_STATUS_SUCCESS;
}

bool allocator::free_into_cache(allocation& a, block_cache& cache, stream_stats& row,
                                stream_handle s, thread_state& ts) {
  // The commit (the ownership transition) and the put happen together under the cache's lock,
  // so that a refused put changes nothing. The origin's own row counts the free there too, and
  // the before-free hook runs there once the free is accepted.
  const size_t size = a.placement.size;
  bool row_counted = false;
  const bool kept =
      cache.put_if(a.placement.base, a.placement.held_bytes, config_.stream_cache_bytes,
                   [&](const spinlock& held) {
                     if (!a.owners.end_sole_ownership()) return false;
                     row_counted = row.freed_if_guarded_by(held, size);
                     if (config_.before_free != nullptr) {
                       run_before_free(*driver_, config_.before_free, config_.before_free_user_data,
                                       a.placement.base, a.placement.held_bytes, s);
                     }
                     return true;
                   });
  if (!kept) return false;
  if (!row_counted) row.freed(size);
  if (notes_cache_moves_) driver_->note_release(a.placement.base, a.placement.held_bytes, s);
  // A cacheable block is held whole: its held bytes are its size (no alignment padding).
  stats_.owned_cache_free(ts.slot.index, static_cast<int64_t>(size));
  return true;
}

arcpool_status_t allocator::deallocate(allocation& a, stream_handle s, uint32_t flags) {
  // The fast path: arcpool's own cacheable memory (decided at allocation: no import, no graph
  // memory, a determinate lifetime), used on its origin stream alone, freed there by its sole
  // owner, into that stream's cache. The origin is created or registered and alive, known
  // without a lookup (while arcpool proves it alive its handle names no other stream,
  // design.md §6), or it is the legacy default stream, which the caller passed. One runtime
  // call, the capture check (a capturing caller takes deallocate_in_capture on the general
  // path).
  if (flags == 0 && a.placement.cacheable) {
    thread_state& ts = this_thread_state();
    if (fast_path_open(ts)) {
      std::lock_guard<spinlock> lock(a.mutex);
      if (s == a.current.handle && a.uses.empty()) {
        stream_entry* const e = a.current.entry;
        block_cache* cache = nullptr;
        stream_stats* row = nullptr;
        if (e != nullptr) {
          if (e == a.placement.origin.entry && e->alive()) {
            cache = &e->cache();
            row = &e->stats();
          }
        } else if (a.current.kind == stream_kind::legacy_default &&
                   a.placement.origin.kind == stream_kind::legacy_default) {
          cache = &legacy_cache_;
          row = &stream_stats_.legacy();
        }
        if (cache != nullptr) {
          bool capturing = false;
          ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s, &capturing));
          if (!capturing && free_into_cache(a, *cache, *row, s, ts)) {
            return ARCPOOL_STATUS_SUCCESS;
          }
        }
      }
    }
  }
  return deallocate_general(a, s, flags);
}

arcpool_status_t allocator::deallocate_general(allocation& a, stream_handle s, uint32_t flags) {
  if (flags != 0) {
    if ((flags & ~kDeallocateFlags) != 0) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown deallocation flags 0x%x", flags);
    }
    const uint32_t routing = flags & kRoutingFlags;
    if ((routing & (routing - 1)) != 0) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "deallocation flags 0x%x name more than one routing strategy", flags);
    }
  }
  std::unique_lock<spinlock> lock(a.mutex);
  // The memory's current stream, created or registered and alive, is known without a lookup:
  // while arcpool proves it alive its handle names no other stream (design.md §6).
  stream_ref caller;
  if (s == a.current.handle && a.current.provably_alive()) {
    caller = a.current;
  } else {
    lock.unlock();  // a lookup may call the runtime
    ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &caller));
    lock.lock();
  }
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(
      a, a.owners.can_deallocate(flags & ARCPOOL_DEALLOCATE_FLAG_FORCE), "deallocate"));
  return finish_deallocation(a, caller, flags, /*implicit=*/false, lock);
}

arcpool_status_t allocator::deallocate_on_current(allocation& a) {
  std::unique_lock<spinlock> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(a, a.owners.can_deallocate(false), "deallocate"));
  return finish_on_current(a, /*implicit=*/false, lock);
}

arcpool_status_t allocator::finish_on_current(allocation& a, bool implicit,
                                              std::unique_lock<spinlock>& lock) {
  const stream_ref caller = a.current;
  if (caller.entry != nullptr) {
    const std::optional<arcpool_status_t> finished = caller.entry->with_alive(
        [&](stream_handle) { return finish_deallocation(a, caller, 0, implicit, lock); });
    if (finished) return *finished;
  }
  return finish_deallocation(a, caller, 0, implicit, lock);  // retired: its final fence
}

void allocator::free_at_last_reference(allocation* a) noexcept {
  const auto state = a->owners.load().st;
  const bool leaked = state == ARCPOOL_ALLOCATION_LIVE || state == ARCPOOL_ALLOCATION_UNOWNED;
  {
    std::unique_lock<spinlock> lock(a->mutex);
    if (leaked) {
      // A leaked owner: free stream-ordered on the current stream (alive by contract, or
      // retired, in which case its final fence goes to the reclaimer). A failure is counted:
      // e.g. capturing, a sticky CUDA error, or no host memory for a fence or a deferred free
      // (the memory then stays in the pool).
      arcpool_status_t status = ARCPOOL_STATUS_OUT_OF_MEMORY;
      try {
        status = finish_on_current(*a, /*implicit=*/true, lock);
      } catch (const std::exception&) {
      }
      // Refused before its commit: counted here, and the allocation goes with its record all
      // the same, off the gauges, its memory written off. A graph pool's block stays in the
      // allocator's pool as well: its pool's reference goes, so that the pool, and then the
      // allocator, can still be released. (A failure after the commit was counted where it
      // happened: commit_and_free, a graph's free node.)
      if (status != ARCPOOL_STATUS_SUCCESS && !a->ended()) {
        stats_.count(stat::reclaim_failures);
        write_off_leaked(*a);
        if (graph_pool* lender = a->lender(); lender != nullptr) lender->abandon();
      }
      if (!lock.owns_lock()) lock.lock();
    }
    // Indeterminate lifetime: the memory goes back now, once its fences complete (the
    // deallocation made its deferred free).
    if (a->deferred_free != nullptr) {
      std::unique_ptr<reclaim_item> item(std::exchange(a->deferred_free, nullptr));
      item->pointer = a->placement.base;
      item->bytes = a->external() ? a->placement.size : a->placement.held_bytes;
      item->origin = a->placement.origin;
      item->counted_on = &stream_stats_of(a->placement.origin);
      item->on_free = a->placement.on_free;
      item->on_free_user_data = a->placement.on_free_user_data;
      lock.unlock();
      reclaimer_.enqueue(std::move(item));
    }
  }
  delete a;
  record_destroyed();
}
}  // namespace arcpool::detail
