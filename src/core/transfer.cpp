// Transfer, use records and export (design.md §5).
#include <algorithm>

#include "core/allocator.hpp"
#include "observe/nvtx.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

constexpr size_t kPoolAlignment = ARCPOOL_DEFAULT_ALIGNMENT;

/// The failure of check_usable, out of line.
[[gnu::noinline, gnu::cold]] arcpool_status_t not_usable(const allocation& a, const char* what) {
  const auto st = a.owners.load().st;
  return fail(ARCPOOL_STATUS_ALREADY_DEALLOCATED, "%s of %s: it was already %s", what,
              a.describe().c_str(), st == ARCPOOL_ALLOCATION_EXPORTED ? "exported" : "deallocated");
}

/// Usable: LIVE or UNOWNED (design.md §3: transfer, record_use, data, views).
inline arcpool_status_t check_usable(const allocation& a, const char* what) {
  const auto st = a.owners.load().st;
  if (st == ARCPOOL_ALLOCATION_LIVE || st == ARCPOOL_ALLOCATION_UNOWNED) {
    return ARCPOOL_STATUS_SUCCESS;
  }
  return not_usable(a, what);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Transfer, use records, export (design.md §5)

arcpool_status_t allocator::transfer(allocation& a, stream_handle to) {
  stream_ref target;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(to, &target));
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(target.handle, &capturing));
  std::lock_guard<spinlock> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(check_usable(a, "transfer"));
  if (capturing) {
    // Within one capture: captured edges from the donors (docs/graphs.md). They order the
    // graph's nodes only, not the work queued on the streams before the capture: memory that
    // existed then keeps its use records, and its current stream becomes one, which its free
    // fences.
    const bool from_before = !a.graph() && a.lender() == nullptr;
    const bool keep_donor = from_before && a.current.id != target.id;
    if (keep_donor && !a.current.provably_alive()) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "transfer of %s during a capture: its current stream %p is not one arcpool "
                  "created or registered, so arcpool could not fence the work queued there "
                  "before the capture once it ends",
                  a.describe().c_str(), static_cast<void*>(a.current.handle));
    }
    ARCPOOL_RETURN_IF_ERROR(edges_within_capture(a, target, "transfer"));
    if (keep_donor) {
      // Fenced at deallocation: it covers an older record of the stream, which it replaces.
      use_record donor{std::move(a.current), fence_ref(), true};
      auto same = std::find_if(a.uses.begin(), a.uses.end(),
                               [&](const use_record& u) { return u.stream.id == donor.stream.id; });
      if (same != a.uses.end()) {
        *same = std::move(donor);
      } else {
        a.uses.push_back(std::move(donor));
      }
    } else if (!from_before) {
      a.uses.clear();
    }
    a.current = std::move(target);
    a.current_fence = fence_ref();  // the donor's, if it had one
    stats_.count(stat::transfers);
    return ARCPOOL_STATUS_SUCCESS;
  }
  // Wait on the donors' fences, then the receiver owns the memory.
  fence_list fences;
  ARCPOOL_RETURN_IF_ERROR(collect_fences(a, nullptr, target.id, &fences));
  ARCPOOL_RETURN_IF_ERROR(wait_all(target.handle, fences));
  // A per-thread default receiver: fence it after the waits, for other threads (§6).
  fence_ref named;
  if (target.kind == stream_kind::per_thread_default) {
    ARCPOOL_RETURN_IF_ERROR(take_fence(target, &named));
  }
  a.uses.clear();
  a.current = std::move(target);
  a.current_fence = std::move(named);
  stats_.count(stat::transfers);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::record_use(allocation& a, stream_handle s, uint32_t flags) {
  if ((flags & ~uint32_t{ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION}) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown record_use flags 0x%x", flags);
  }
  thread_state& ts = this_thread_state();  // the one lookup of the thread's state
  stream_ref user;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(ts, s, &user));
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(user.handle, &capturing));
  std::lock_guard<spinlock> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(check_usable(a, "record_use"));
  if (user.id == a.current.id && !a.current.retired()) {
    // Its own order covers it, but for a per-thread default stream, which other threads cannot
    // name: what they wait on is the fence taken when it was named (design.md §6), taken again
    // now so that it covers the work queued there since. (A retired current stream is never
    // enqueued on again, and its final fence covers only what came before its retirement: a
    // use of it, unregistered still or registered again as another, live entry, is recorded as
    // any other stream's.)
    if (user.kind != stream_kind::per_thread_default || capturing) return ARCPOOL_STATUS_SUCCESS;
    fence_ref now;
    ARCPOOL_RETURN_IF_ERROR(take_fence(user, &now));
    a.current_fence = std::move(now);
    return ARCPOOL_STATUS_SUCCESS;
  }
  bool at_deallocation = true;
  fence_ref fence;
  if (capturing) {
    // Within one capture: no fence now (an event recorded in a capture is no fence); the
    // deallocation in the capture makes a captured edge from it (docs/graphs.md). Should the
    // deallocation come after the capture, the user is fenced then: same_capture refuses a
    // user arcpool neither created, registered nor named capture-scoped, and a capture-scoped
    // one (a stream the capture forked to) may be gone by then unless the caller says not.
    if (user.capture_scoped() &&
        (flags & ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION) == 0) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "record_use of %s on stream %p during a capture: arcpool neither created nor "
                  "registered the stream, so it could not fence it should the deallocation come "
                  "after the capture; register it before the capture, or pass "
                  "ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION",
                  a.describe().c_str(), static_cast<void*>(user.handle));
    }
    ARCPOOL_RETURN_IF_ERROR(same_capture(a.current, user, "record_use"));
  } else {
    // An unregistered stream may be gone by deallocation time: fence it now (§6), unless the
    // caller guarantees it outlives the deallocation. Another thread cannot fence a per-thread
    // default stream: fence it now for them in any case.
    const bool alive = user.provably_alive();
    at_deallocation = alive || (flags & ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION) != 0;
    // A record that fences this stream at deallocation with no fence now, by the same registry
    // entry (a stream unregistered and registered again has a new one, alive where the old is
    // retired), already covers this use (a stream recorded again and again, as record_stream
    // does). It also covers more than a fence taken now would: a plain record after one that
    // said the stream outlives the deallocation takes back no promise.
    for (const use_record& u : a.uses) {
      if (u.stream.id == user.id && u.stream.entry == user.entry &&
          u.stream.handle == user.handle && u.at_deallocation && !u.fence) {
        stats_.at(thread_shard(ts)).count(stat::use_records);
        return ARCPOOL_STATUS_SUCCESS;
      }
    }
    if (!alive && (!at_deallocation || user.kind == stream_kind::per_thread_default)) {
      ARCPOOL_RETURN_IF_ERROR(take_fence(user, &fence));
    }
  }
  use_record record{std::move(user), std::move(fence), at_deallocation};
  auto same = std::find_if(a.uses.begin(), a.uses.end(),
                           [&](const use_record& u) { return u.stream.id == record.stream.id; });
  if (same != a.uses.end()) {
    *same = std::move(record);
  } else {
    a.uses.push_back(std::move(record));
  }
  stats_.at(thread_shard(ts)).count(stat::use_records);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::check_current_fenceable(const allocation& a, const char* what) {
  if (a.current.retired()) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "%s of %s: its current stream was destroyed or unregistered; transfer it to a "
                "live stream first",
                what, a.describe().c_str());
  }
  if (!a.current.reachable()) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "%s of %s: its current stream is another thread's per-thread default stream, "
                "which this thread cannot name; do it on that thread or transfer it first",
                what, a.describe().c_str());
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::record_after_uses(allocation& a, event_handle e, stream_handle helper,
                                              const char* what) {
  std::lock_guard<spinlock> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(check_current_fenceable(a, what));
  ARCPOOL_RETURN_IF_ERROR(check_not_capturing(a.current, what));
  if (a.uses.empty()) {
    // The current stream alone: recorded there, so that sends add no wait to a shared stream.
    if (a.current.entry == nullptr) return driver_->event_record(e, a.current.handle);
    const std::optional<arcpool_status_t> recorded =
        a.current.entry->with_alive([&](stream_handle h) { return driver_->event_record(e, h); });
    return recorded ? *recorded : check_current_fenceable(a, what);  // retired meanwhile
  }
  fence_list fences;
  ARCPOOL_RETURN_IF_ERROR(collect_fences(a, nullptr, kSkipNone, &fences));
  ARCPOOL_RETURN_IF_ERROR(wait_all(helper, fences));
  return driver_->event_record(e, helper);
}

arcpool_status_t allocator::export_memory(allocation& a, void** out) {
  std::lock_guard<spinlock> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(a, a.owners.can_deallocate(false), "export"));
  // Only memory arcpool took from its pool: an import is freed by its on_free (or by its
  // owner), graph memory by its graph, and a graph pool's block goes back to that pool.
  constexpr uint32_t kNotPool = ARCPOOL_PLACEMENT_FLAG_EXTERNAL | ARCPOOL_PLACEMENT_FLAG_GRAPH |
                                ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL;
  if ((a.placement.placement_flags & kNotPool) != 0) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "export of %s: it is %s, not memory of this allocator's pool; deallocate it "
                "instead",
                a.describe().c_str(),
                a.external() ? "imported memory (its on_free or its owner frees it)"
                : a.graph()  ? "graph memory (its graph frees it)"
                             : "a graph pool's block (it goes back to that pool)");
  }
  if (a.placement.alignment > kPoolAlignment) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "export of %s: its alignment %zu exceeds the pool's, so its data pointer is not "
                "the pool's pointer",
                a.describe().c_str(), a.placement.alignment);
  }
  ARCPOOL_RETURN_IF_ERROR(check_current_fenceable(a, "export"));
  fence_list fences;
  if (a.placement.size > 0) {
    ARCPOOL_RETURN_IF_ERROR(check_not_capturing(a.current, "export"));
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, nullptr, a.current.id, &fences));
  }
  // The waits first: if one fails nothing has changed. The current stream, which the caller
  // did not name, stays alive for them when arcpool knows it (a destroy waits, design.md §6).
  if (a.current.entry != nullptr) {
    const std::optional<arcpool_status_t> waited =
        a.current.entry->with_alive([&](stream_handle h) { return wait_all(h, fences); });
    if (!waited) return check_current_fenceable(a, "export");  // retired meanwhile
    ARCPOOL_RETURN_IF_ERROR(*waited);
  } else {
    ARCPOOL_RETURN_IF_ERROR(wait_all(a.current.handle, fences));
  }
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(a, a.owners.accept_export(), "export"));
  a.uses.clear();
  stats_.count(stat::exports);
  // The memory leaves arcpool here, as at a free: the log's row, else a replay or a plot of it
  // keeps the allocation live for ever (and meets its address again when the pool lends it).
  if (log_.enabled()) log_.write("free", a.placement.data, a.placement.size, a.current.handle);
  nvtx::forget_region(a.placement.data);
  stats_.sub(stat::bytes_in_use, a.placement.size);
  stats_.sub(stat::allocations_in_use, 1);
  stats_.sub(stat::bytes_held, a.placement.held_bytes);
  stream_stats_of(a.placement.origin).freed(a.placement.size);
  history_.segment_free(a.placement.base, a.current.handle);
  *out = a.placement.base;
  return ARCPOOL_STATUS_SUCCESS;
}
}  // namespace arcpool::detail
