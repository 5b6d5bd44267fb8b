#include "core/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <thread>

#include "core/janitor.hpp"
#include "observe/nvtx.hpp"
#include "support/process_exit.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

constexpr size_t kPoolAlignment = ARCPOOL_DEFAULT_ALIGNMENT;

constexpr uint32_t kRoutingFlags = ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE |
                                   ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN |
                                   ARCPOOL_DEALLOCATE_FLAG_DEFERRED;
constexpr uint32_t kDeallocateFlags = ARCPOOL_DEALLOCATE_FLAG_FORCE | kRoutingFlags;

bool is_power_of_two(size_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

/// Allocation serial numbers, unique per process, taken from a global counter in blocks so
/// that threads do not contend on it.
uint64_t next_serial() noexcept {
  constexpr uint64_t kBlock = 1024;
  static std::atomic<uint64_t> global{1};
  thread_local uint64_t next = 0;
  thread_local uint64_t end = 0;
  if (next == end) {
    next = global.fetch_add(kBlock, std::memory_order_relaxed);
    end = next + kBlock;
  }
  return next++;
}

void* align_up(void* p, size_t alignment) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((v + alignment - 1) & ~(uintptr_t{alignment} - 1));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Lifetime

arcpool_status_t allocator::create(const allocator_config& config, allocator** out) {
  std::unique_ptr<driver> drv;
  ARCPOOL_RETURN_IF_ERROR(make_driver(config.driver, &drv));
  auto* a = new allocator(config, std::move(drv));
  if (const char* path = std::getenv("ARCPOOL_LOG"); path != nullptr && *path != '\0') {
    static std::atomic<unsigned> opened{0};  // allocators that opened an ARCPOOL_LOG file
    const std::string file = numbered_log_path(path, opened.fetch_add(1));
    if (arcpool_status_t status = a->log_.open(file.c_str()); status != ARCPOOL_STATUS_SUCCESS) {
      a->release();
      return status;
    }
  }
  *out = a;
  return ARCPOOL_STATUS_SUCCESS;
}

allocator::allocator(const allocator_config& config, std::unique_ptr<driver> drv)
    : config_(config),
      driver_(std::move(drv)),
      events_(*driver_, config.event_pool_capacity),
      reclaimer_(*driver_, stats_, config.before_free, config.before_free_user_data) {
  // A hard limit is enforced on the exact total of held bytes.
  hard_limit_.store(config_.hard_limit_bytes, std::memory_order_relaxed);
  if (config_.hard_limit_bytes != 0) stats_.bytes_held.set_flush_threshold(0);
}

allocator::~allocator() {
  // The reclaim worker may still free on created streams: finish and stop it first.
  reclaimer_.stop_worker(/*drain_first=*/!process_exiting());
  if (!process_exiting()) flush_caches(/*include_legacy=*/true, /*synchronize=*/false);
  // Streams arcpool created die with it; registered ones are only forgotten.
  if (!process_exiting()) {
    streams_.for_each([&](stream_entry& entry) {
      if (entry.created()) driver_->stream_destroy(entry.handle());
    });
  }
}

void allocator::release() noexcept {
  if (!refs_.decrement()) return;
  closing_.store(true, std::memory_order_seq_cst);
  // Teardown joins the reclaim worker: never from the worker itself (an on_free callback that
  // released the last handle); and not while records live. Otherwise at once.
  if (!reclaimer_.on_worker_thread() && quiescent()) {
    delete this;
  } else {
    janitor_adopt(this);
  }
}

void allocator::record_destroyed() noexcept {
  // Read before the decrement: after it, the janitor may delete the allocator at any time.
  const bool closing = closing_.load(std::memory_order_seq_cst);
  records_.add_release(-1);
  if (closing) janitor_wake();
}

// ---------------------------------------------------------------------------------------------
// Streams

namespace {

/// The calling thread's last stream lookups. A line is valid while its registry's version is
/// unchanged. Handles are cached only for streams that cannot be recycled meanwhile: created and
/// registered ones (alive until their removal, which changes the version) and the default
/// streams; unregistered application streams are looked up by identity each time.
struct stream_cache_line {
  uint64_t registry;  ///< stream_registry::uid()
  uint64_t version;
  stream_handle handle;
  uint64_t id;
  stream_entry* entry;
  stream_kind kind;
};
constexpr size_t kStreamCacheLines = 8;
thread_local stream_cache_line t_stream_cache[kStreamCacheLines] = {};
thread_local size_t t_stream_cache_next = 0;

stream_kind kind_of(stream_handle s) {
  if (s == legacy_default_stream() || s == legacy_stream_alias()) {
    return stream_kind::legacy_default;
  }
  return s == per_thread_default_stream() ? stream_kind::per_thread_default
                                          : stream_kind::application;
}

}  // namespace

arcpool_status_t allocator::resolve_stream(stream_handle s, stream_ref* out) {
  const uint64_t version = streams_.version();
  for (const stream_cache_line& line : t_stream_cache) {
    if (line.handle == s && line.registry == streams_.uid() && line.version == version) {
      *out = stream_ref{s, line.id, line.kind, line.entry};
      if (line.kind == stream_kind::per_thread_default) out->thread = this_thread_serial();
      return ARCPOOL_STATUS_SUCCESS;
    }
  }
  out->handle = s;
  out->kind = kind_of(s);
  out->thread = out->kind == stream_kind::per_thread_default ? this_thread_serial() : 0;
  // Capture first: whether cudaStreamGetId is legal on a capturing stream is undocumented
  // (CCCL treats the query as invalidating the capture), and arcpool refuses such streams.
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s, &capturing));
  if (capturing) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "stream %p is capturing a CUDA graph; arcpool does not support graph capture yet",
                static_cast<void*>(s));
  }
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_id(s, &out->id));
  out->entry = out->kind == stream_kind::application ? streams_.find(out->id) : nullptr;
  if (out->entry != nullptr || out->kind != stream_kind::application) {
    t_stream_cache[t_stream_cache_next++ % kStreamCacheLines] =
        stream_cache_line{streams_.uid(), version, s, out->id, out->entry, out->kind};
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::check_not_capturing(const stream_ref& s, const char* what) {
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s.handle, &capturing));
  if (capturing) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "%s: stream %p (id %llu) is capturing a CUDA graph; arcpool does not support "
                "graph capture yet",
                what, static_cast<void*>(s.handle), static_cast<unsigned long long>(s.id));
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::create_stream(stream_handle* out) {
  stream_handle s = nullptr;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_create(&s));
  uint64_t id = 0;
  if (arcpool_status_t status = driver_->stream_id(s, &id); status != ARCPOOL_STATUS_SUCCESS) {
    driver_->stream_destroy(s);
    return status;
  }
  streams_.add(std::make_unique<stream_entry>(s, id, /*created=*/true));
  *out = s;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::destroy_stream(stream_handle s) {
  stream_ref ref;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &ref));
  if (!ref.entry || !ref.entry->created()) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "stream %p was not created by this allocator (arcpool_stream_create)",
                static_cast<void*>(s));
  }
  // Before any call on it: the cache's frees and the final fence would land in the capture.
  ARCPOOL_RETURN_IF_ERROR(check_not_capturing(ref, "stream_destroy"));
  flush_cache(ref.entry->cache(), s, /*close=*/true);
  ARCPOOL_RETURN_IF_ERROR(ref.entry->retire(events_));
  streams_.remove(ref.id);
  return driver_->stream_destroy(s);
}

arcpool_status_t allocator::register_stream(stream_handle s) {
  stream_ref ref;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &ref));
  if (ref.kind != stream_kind::application) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "stream %p is a default stream: the legacy default stream is enqueued on only "
                "when passed, and a per-thread default stream is a different stream on every "
                "thread",
                static_cast<void*>(s));
  }
  if (ref.entry) return ARCPOOL_STATUS_SUCCESS;  // already known
  streams_.add(std::make_unique<stream_entry>(s, ref.id, /*created=*/false));
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::unregister_stream(stream_handle s) {
  stream_ref ref;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &ref));
  if (!ref.entry || ref.entry->created()) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "stream %p is not registered with this allocator",
                static_cast<void*>(s));
  }
  // Before any call on it: the cache's frees and the final fence would land in the capture.
  ARCPOOL_RETURN_IF_ERROR(check_not_capturing(ref, "stream_unregister"));
  flush_cache(ref.entry->cache(), s, /*close=*/true);
  ARCPOOL_RETURN_IF_ERROR(ref.entry->retire(events_));
  streams_.remove(ref.id);
  return ARCPOOL_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// The fast path's caches

block_cache* allocator::cache_for(const stream_ref& s) noexcept {
  if (config_.stream_cache_bytes == 0) return nullptr;
  if (s.entry != nullptr) return &s.entry->cache();
  return s.kind == stream_kind::legacy_default ? &legacy_cache_ : nullptr;
}

size_t allocator::flush_cache(block_cache& cache, stream_handle s, bool close) {
  int64_t blocks = 0;
  const size_t bytes = cache.drain(
      [&](void* p, size_t n) {
        ++blocks;
        if (driver_->pool_free(p, n, s) == ARCPOOL_STATUS_SUCCESS) stats::count(stats_.frees);
      },
      close);
  stats::count(stats_.cache_flushes, blocks);
  stats_.bytes_cached.sub(static_cast<int64_t>(bytes));
  stats_.bytes_held.sub(static_cast<int64_t>(bytes));
  return static_cast<size_t>(blocks);
}

void allocator::flush_caches(bool include_legacy, bool synchronize) {
  // Only streams alive and not capturing: a free must never land in someone's graph.
  auto flush = [&](block_cache& cache, stream_handle h) {
    if (cache.bytes() == 0) return;  // nothing to give back: not even a query on the stream
    bool capturing = true;
    if (driver_->stream_is_capturing(h, &capturing) != ARCPOOL_STATUS_SUCCESS || capturing) {
      return;
    }
    if (flush_cache(cache, h, /*close=*/false) > 0 && synchronize) {
      driver_->stream_synchronize(h);  // the frees ran: the pool may hand the blocks to anyone
    }
  };
  streams_.for_each([&](stream_entry& entry) {
    entry.with_alive([&](stream_handle h) {
      flush(entry.cache(), h);
      return ARCPOOL_STATUS_SUCCESS;
    });
  });
  if (include_legacy) flush(legacy_cache_, legacy_default_stream());
}

// ---------------------------------------------------------------------------------------------
// Fences

arcpool_status_t allocator::take_fence(const stream_ref& s, fence_ref* out) {
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  if (s.entry) {
    // A created or registered stream: enqueue only while provably alive; once retired, its
    // final fence covers everything that was queued on it.
    const std::optional<arcpool_status_t> recorded = s.entry->with_alive([&](stream_handle h) {
      ARCPOOL_RETURN_IF_ERROR(check_not_capturing(s, "fence"));
      return events_.record(h, s.id, out);
    });
    if (!recorded) {
      *out = s.entry->final_fence();
      return ARCPOOL_STATUS_SUCCESS;
    }
    status = *recorded;
  } else {
    // Passed in this call, or the current stream, which the caller keeps alive (§6).
    ARCPOOL_RETURN_IF_ERROR(check_not_capturing(s, "fence"));
    status = events_.record(s.handle, s.id, out);
  }
  if (status == ARCPOOL_STATUS_SUCCESS) stats::count(stats_.fences_taken);
  return status;
}

arcpool_status_t allocator::collect_fences(allocation& a, const stream_ref* caller,
                                           uint64_t skip_id, fence_list* out) {
  small_vector<uint64_t, 8> seen;
  if (skip_id != kSkipNone) seen.push_back(skip_id);
  auto fresh = [&seen](uint64_t id) {
    for (uint64_t s : seen) {
      if (s == id) return false;
    }
    seen.push_back(id);
    return true;
  };
  auto take = [&](const stream_ref& s) -> arcpool_status_t {
    if (!fresh(s.id)) return ARCPOOL_STATUS_SUCCESS;
    if (!s.reachable()) {
      // Another thread's per-thread default stream (the current stream, or an implicit free's
      // caller, which is the current stream): its handle would name this thread's stream. The
      // fence taken when it was named stands for it (§6).
      if (a.current_fence && s.id == a.current.id) out->push_back(a.current_fence);
      return ARCPOOL_STATUS_SUCCESS;
    }
    fence_ref f;
    ARCPOOL_RETURN_IF_ERROR(take_fence(s, &f));
    out->push_back(std::move(f));
    return ARCPOOL_STATUS_SUCCESS;
  };
  if (caller != nullptr) ARCPOOL_RETURN_IF_ERROR(take(*caller));
  ARCPOOL_RETURN_IF_ERROR(take(a.current));
  for (const use_record& u : a.uses) {
    if (u.at_deallocation && u.stream.reachable()) {
      ARCPOOL_RETURN_IF_ERROR(take(u.stream));
    } else if (fresh(u.stream.id)) {
      out->push_back(u.fence);
    }
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::wait_all(stream_handle s, const fence_list& fences) {
  for (const fence_ref& f : fences) {
    ARCPOOL_RETURN_IF_ERROR(driver_->stream_wait_event(s, f->event()));
  }
  return ARCPOOL_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Allocation

arcpool_status_t allocator::try_pool_allocate(size_t bytes, const stream_ref& s, void** out) {
  if (const size_t limit = hard_limit_.load(std::memory_order_relaxed); limit != 0) {
    if (!stats_.bytes_held.try_add(static_cast<int64_t>(bytes), static_cast<int64_t>(limit))) {
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "hard limit of %zu bytes reached", limit);
    }
  } else {
    stats_.bytes_held.add(bytes);
  }
  const arcpool_status_t status = driver_->pool_allocate(bytes, s.handle, out);
  if (status != ARCPOOL_STATUS_SUCCESS) stats_.bytes_held.sub(bytes);
  return status;
}

arcpool_status_t allocator::allocate_from_pool(size_t bytes, size_t requested, const stream_ref& s,
                                               void** out) {
  arcpool_status_t status = try_pool_allocate(bytes, s, out);
  if (status != ARCPOOL_STATUS_OUT_OF_MEMORY) return status;
  // Out of memory: complete pending reclaims, retry once, then ask the user's callback.
  stats::count(stats_.oom_retries);
  // The legacy default stream is touched only when the caller passed it (§6). The flushed
  // frees must have run before the retry: the pool lends a block freed on another stream only
  // once its free completed.
  flush_caches(/*include_legacy=*/s.kind == stream_kind::legacy_default, /*synchronize=*/true);
  reclaimer_.drain();
  // Frees already queued on arcpool's other streams (same-stream and routed frees, caches off)
  // hold pool memory until they run: an owned pool inserts no hidden wait to lend it. Streams
  // arcpool does not know may be gone: their frees are not waited for.
  synchronize_known_streams();
  status = try_pool_allocate(bytes, s, out);
  while (status == ARCPOOL_STATUS_OUT_OF_MEMORY && config_.on_out_of_memory != nullptr &&
         config_.on_out_of_memory(requested, config_.on_out_of_memory_user_data) != 0) {
    status = try_pool_allocate(bytes, s, out);
  }
  if (status != ARCPOOL_STATUS_OUT_OF_MEMORY) return status;
  stats::count(stats_.oom_failures);
  const std::string cause = last_error();
  const pool_figures pool = driver_->pool_query();
  return fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
              "cannot allocate %zu bytes on device %d (stream %p): %s; allocator: %llu bytes in "
              "use, %llu held, %llu pending free; pool: %llu reserved, %llu used; hard limit %zu",
              requested, driver_->device(), static_cast<void*>(s.handle), cause.c_str(),
              static_cast<unsigned long long>(stats_.bytes_in_use.current()),
              static_cast<unsigned long long>(stats_.bytes_held.current()),
              static_cast<unsigned long long>(stats_.bytes_pending_free.current()),
              static_cast<unsigned long long>(pool.reserved_current),
              static_cast<unsigned long long>(pool.used_current),
              hard_limit_.load(std::memory_order_relaxed));
}

arcpool_status_t allocator::allocate(size_t size, size_t alignment, stream_handle s, uint32_t flags,
                                     allocation** out) {
  if (alignment == 0) alignment = ARCPOOL_DEFAULT_ALIGNMENT;
  if (!is_power_of_two(alignment) || alignment > ARCPOOL_MAX_ALIGNMENT) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "alignment %zu is not a power of two up to %zu",
                alignment, ARCPOOL_MAX_ALIGNMENT);
  }
  if ((flags & ~uint32_t{ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME}) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown allocation flags 0x%x", flags);
  }
  allocation::params p;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &p.origin));
  ARCPOOL_RETURN_IF_ERROR(check_not_capturing(p.origin, "allocate"));
  p.placement_flags = ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS;
  if (flags & ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME) {
    p.placement_flags |= ARCPOOL_PLACEMENT_FLAG_INDETERMINATE_LIFETIME;
  }
  p.size = size;
  p.alignment = alignment;
  // Fast path: a block of exactly this size freed earlier on this stream. Stream order makes
  // it safe with no event: every wait it needed was enqueued before it was cached.
  // Cost: a thread-local stream lookup, the capture check, a spinlock and a hash lookup.
  block_cache* cache = flags == 0 && cacheable(size, alignment) ? cache_for(p.origin) : nullptr;
  if (void* block = cache != nullptr ? cache->take(size) : nullptr; block != nullptr) {
    stats::count(stats_.cache_hits);
    stats_.bytes_cached.sub(static_cast<int64_t>(size));
    driver_->note_acquire(block, size, s);
    p.base = p.data = block;
    p.held_bytes = size;
  } else if (size > 0) {
    // Alignments above the pool's are served by over-allocating and aligning up.
    const size_t extra = alignment > kPoolAlignment ? alignment - kPoolAlignment : 0;
    if (size > SIZE_MAX - extra) {
      stats::count(stats_.oom_failures);
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "%zu bytes with alignment %zu overflow size_t",
                  size, alignment);
    }
    p.held_bytes = size + extra;
    if (arcpool_status_t status = allocate_from_pool(p.held_bytes, size, p.origin, &p.base);
        status != ARCPOOL_STATUS_SUCCESS) {
      if (log_.enabled()) log_.write("allocate failure", nullptr, size, s);
      return status;
    }
    p.data = align_up(p.base, alignment);
  }
  auto give_back = [&] {
    if (p.base != nullptr) {
      driver_->pool_free(p.base, p.held_bytes, s);
      stats_.bytes_held.sub(p.held_bytes);
    }
  };
  // Another thread may deallocate or transfer it, and cannot fence this thread's per-thread
  // default stream: fence it now, after the allocation (§6).
  fence_ref named;
  if (p.origin.kind == stream_kind::per_thread_default && p.base != nullptr) {
    if (arcpool_status_t status = take_fence(p.origin, &named); status != ARCPOOL_STATUS_SUCCESS) {
      give_back();
      return status;
    }
  }
  p.serial = next_serial();
  allocation* a = new (std::nothrow) allocation(*this, p);
  if (a == nullptr) {
    give_back();
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an allocation record");
  }
  a->current_fence = std::move(named);
  record_created();
  stats::count(stats_.allocations);
  if (log_.enabled()) log_.write("allocate", p.data, size, s);
  nvtx::name_region(p.data, size, p.serial);
  stats_.bytes_in_use.add(size);
  stats_.allocations_in_use.add(1);
  *out = a;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::import(void* pointer, size_t size, stream_handle s, uint32_t flags,
                                   arcpool_on_free_t on_free, void* user_data, allocation** out) {
  const bool consume = flags & ARCPOOL_IMPORT_FLAG_CONSUME;
  // A consuming import owns the foreign claim from the start: every failure frees it.
  auto failed = [&](arcpool_status_t status) {
    if (consume && on_free != nullptr) on_free(pointer, size, user_data);
    return status;
  };
  constexpr uint32_t kImportFlags =
      ARCPOOL_IMPORT_FLAG_CONSUME | ARCPOOL_IMPORT_FLAG_INDETERMINATE_LIFETIME;
  if ((flags & ~kImportFlags) != 0) {
    return failed(fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown import flags 0x%x", flags));
  }
  if (consume && on_free == nullptr) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "a consuming import needs on_free");
  }
  if (pointer == nullptr && size != 0) {
    return failed(
        fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "import of %zu bytes at a null pointer", size));
  }
  allocation::params p;
  if (arcpool_status_t status = resolve_stream(s, &p.origin); status != ARCPOOL_STATUS_SUCCESS) {
    return failed(status);
  }
  p.placement_flags = ARCPOOL_PLACEMENT_FLAG_ASYNCHRONOUS | ARCPOOL_PLACEMENT_FLAG_EXTERNAL;
  if (flags & ARCPOOL_IMPORT_FLAG_INDETERMINATE_LIFETIME) {
    p.placement_flags |= ARCPOOL_PLACEMENT_FLAG_INDETERMINATE_LIFETIME;
  }
  p.size = size;
  p.alignment = 1;
  p.base = pointer;
  p.data = pointer;
  p.on_free = on_free;
  p.on_free_user_data = user_data;
  p.serial = next_serial();
  allocation* a = new (std::nothrow) allocation(*this, p);
  if (a == nullptr) {
    return failed(fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an allocation record"));
  }
  record_created();
  stats::count(stats_.imports);
  *out = a;
  return ARCPOOL_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Ownership

arcpool_status_t allocator::ownership_failure(const allocation& a, ownership_result r,
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

arcpool_status_t allocator::preserve(allocation& a) {
  return ownership_failure(a, a.owners.preserve(), "preserve");
}

arcpool_status_t allocator::discard(allocation& a, bool* was_last) {
  return ownership_failure(a, a.owners.discard(was_last), "discard");
}

/// Usable: LIVE or UNOWNED (design.md §3: transfer, record_use, data, views).
static arcpool_status_t check_usable(const allocation& a, const char* what) {
  const auto st = a.owners.load().st;
  if (st == ARCPOOL_ALLOCATION_LIVE || st == ARCPOOL_ALLOCATION_UNOWNED) {
    return ARCPOOL_STATUS_SUCCESS;
  }
  return fail(ARCPOOL_STATUS_ALREADY_DEALLOCATED, "%s of %s: it was already %s", what,
              a.describe().c_str(), st == ARCPOOL_ALLOCATION_EXPORTED ? "exported" : "deallocated");
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
  if (implicit) {
    if (!a.owners.accept_implicit_free()) {
      return ownership_failure(a, ownership_result::already_deallocated, "implicit free");
    }
  } else {
    ARCPOOL_RETURN_IF_ERROR(
        ownership_failure(a, a.owners.accept_deallocation(force), "deallocate"));
  }
  stats::count(implicit ? stats_.implicit_frees : stats_.deallocations);
  a.current_fence = fence_ref();  // the deallocation's fences were collected before the commit
  if (log_.enabled() && !a.external()) {
    log_.write("free", a.placement.data, a.placement.size, stream);
  }
  nvtx::forget_region(a.placement.data);
  if (!a.external()) {
    stats_.bytes_in_use.sub(a.placement.size);
    stats_.allocations_in_use.sub(1);
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::commit_and_free(allocation& a, const stream_ref& caller, bool force,
                                            bool implicit, stream_handle target,
                                            block_cache* target_cache, const fence_list& fences) {
  // The waits first: if one fails nothing has changed (a wait is harmless if the commit then
  // fails).
  ARCPOOL_RETURN_IF_ERROR(wait_all(target, fences));
  ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
  a.uses.clear();
  if (config_.before_free != nullptr) {
    config_.before_free(a.placement.base, a.placement.held_bytes, target,
                        config_.before_free_user_data);
  }
  // Every wait the block needs is enqueued on `target`: its cache may keep it (§4).
  if (target_cache != nullptr && cacheable(a.placement.size, a.placement.alignment) &&
      target_cache->put(a.placement.base, a.placement.held_bytes, config_.stream_cache_bytes)) {
    stats::count(stats_.cache_frees);
    stats_.bytes_cached.add(static_cast<int64_t>(a.placement.held_bytes));
    driver_->note_release(a.placement.base, a.placement.held_bytes, target);
    return ARCPOOL_STATUS_SUCCESS;
  }
  // Only a broken context fails here, after the commit: the block is then lost with it.
  const arcpool_status_t status =
      driver_->pool_free(a.placement.base, a.placement.held_bytes, target);
  stats_.bytes_held.sub(a.placement.held_bytes);
  if (status == ARCPOOL_STATUS_SUCCESS) stats::count(stats_.frees);
  return status;
}

arcpool_status_t allocator::finish_deallocation(allocation& a, const stream_ref& caller,
                                                uint32_t flags, bool implicit,
                                                std::unique_lock<std::mutex>& lock) {
  const bool force = flags & ARCPOOL_DEALLOCATE_FLAG_FORCE;
  fence_list fences;

  // Nothing to give back: zero bytes of arcpool's, or a borrowed import nobody wants to hear
  // about. (An import with on_free hears about it even at zero bytes.)
  if (a.external() ? a.placement.on_free == nullptr : a.placement.size == 0) {
    ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
    a.uses.clear();
    return ARCPOOL_STATUS_SUCCESS;
  }

  // Indeterminate lifetime: take the fences now, free nothing until the last reference goes.
  if (a.indeterminate()) {
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, kSkipNone, &fences));
    ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
    stats::count(stats_.ignored_deallocations);
    a.held_fences = std::move(fences);
    a.uses.clear();
    return ARCPOOL_STATUS_SUCCESS;
  }

  // Imported memory: on_free runs on the reclaim worker once every fence completed.
  if (a.external()) {
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, kSkipNone, &fences));
    ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
    reclaim_item item;
    item.pointer = a.placement.base;
    item.bytes = a.placement.size;
    item.fences = std::move(fences);
    item.on_free = a.placement.on_free;
    item.on_free_user_data = a.placement.on_free_user_data;
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
  if (caller_usable) ARCPOOL_RETURN_IF_ERROR(check_not_capturing(caller, "deallocate"));
  route r =
      a.current.retired() || !caller_usable ? route::deferred : choose_route(a, caller, flags);
  const stream_ref& origin = a.placement.origin;

  if (r == route::same_stream) {
    ARCPOOL_RETURN_IF_ERROR(
        commit_and_free(a, caller, force, implicit, caller.handle, cache_for(caller), fences));
    stats::count(stats_.same_stream_frees);
    return ARCPOOL_STATUS_SUCCESS;
  }

  if (r == route::prefer_origin && origin.id != caller.id) {
    if (origin.provably_alive()) {
      ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, origin.id, &fences));
      // The origin stays alive for the whole call: waits, commit and free.
      const std::optional<arcpool_status_t> freed = origin.entry->with_alive([&](stream_handle h) {
        ARCPOOL_RETURN_IF_ERROR(check_not_capturing(origin, "deallocate"));
        ARCPOOL_RETURN_IF_ERROR(
            commit_and_free(a, caller, force, implicit, h, cache_for(origin), fences));
        stats::count(stats_.cross_stream_frees);
        stats::count(stats_.origin_routed_frees);
        return ARCPOOL_STATUS_SUCCESS;
      });
      if (freed) return *freed;
      // Retired since the check: fence again (the origin's final fence among them, if it is
      // the current stream) and free on the caller's stream.
      fences.clear();
    }
    stats::count(stats_.origin_fallbacks);
    r = route::wait_and_free;
  }

  if (r == route::wait_and_free || r == route::prefer_origin) {
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, nullptr, caller.id, &fences));
    ARCPOOL_RETURN_IF_ERROR(
        commit_and_free(a, caller, force, implicit, caller.handle, cache_for(caller), fences));
    stats::count(stats_.cross_stream_frees);
    return ARCPOOL_STATUS_SUCCESS;
  }

  // Deferred: fence everything, let the reclaim worker free on the origin once all completed.
  ARCPOOL_RETURN_IF_ERROR(collect_fences(a, &caller, kSkipNone, &fences));
  ARCPOOL_RETURN_IF_ERROR(commit(a, force, implicit, caller.handle));
  stats::count(stats_.cross_stream_frees);
  reclaim_item item;
  item.pointer = a.placement.base;
  item.bytes = a.placement.held_bytes;
  item.fences = std::move(fences);
  item.origin = origin;
  item.routed_to_origin = true;
  a.uses.clear();
  lock.unlock();
  reclaimer_.enqueue(std::move(item));
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::deallocate(allocation& a, stream_handle s, uint32_t flags) {
  if ((flags & ~kDeallocateFlags) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown deallocation flags 0x%x", flags);
  }
  const uint32_t routing = flags & kRoutingFlags;
  if ((routing & (routing - 1)) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "deallocation flags 0x%x name more than one routing strategy", flags);
  }
  stream_ref caller;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &caller));
  std::unique_lock<std::mutex> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(
      a, a.owners.can_deallocate(flags & ARCPOOL_DEALLOCATE_FLAG_FORCE), "deallocate"));
  return finish_deallocation(a, caller, flags, /*implicit=*/false, lock);
}

arcpool_status_t allocator::deallocate_on_current(allocation& a) {
  std::unique_lock<std::mutex> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(a, a.owners.can_deallocate(false), "deallocate"));
  const stream_ref caller = a.current;
  return finish_deallocation(a, caller, 0, /*implicit=*/false, lock);
}

void allocator::on_last_reference(allocation* a) noexcept {
  {
    std::unique_lock<std::mutex> lock(a->mutex);
    const auto st = a->owners.load().st;
    if (st == ARCPOOL_ALLOCATION_LIVE || st == ARCPOOL_ALLOCATION_UNOWNED) {
      // A leaked owner: free stream-ordered on the current stream (alive by contract, or
      // retired, in which case its final fence goes to the reclaimer).
      const stream_ref caller = a->current;
      if (finish_deallocation(*a, caller, 0, /*implicit=*/true, lock) != ARCPOOL_STATUS_SUCCESS) {
        stats::count(stats_.reclaim_failures);  // e.g. capturing, or a sticky CUDA error
      }
      if (!lock.owns_lock()) lock.lock();
    }
    // Indeterminate lifetime: the memory goes back now, once its fences complete.
    if (a->indeterminate() && a->owners.load().st == ARCPOOL_ALLOCATION_DEALLOCATED &&
        (a->external() ? a->placement.on_free != nullptr : a->placement.size > 0)) {
      reclaim_item item;
      item.pointer = a->placement.base;
      item.bytes = a->external() ? a->placement.size : a->placement.held_bytes;
      item.fences = std::move(a->held_fences);
      item.origin = a->placement.origin;
      item.on_free = a->placement.on_free;
      item.on_free_user_data = a->placement.on_free_user_data;
      lock.unlock();
      reclaimer_.enqueue(std::move(item));
    }
  }
  delete a;
  record_destroyed();
}

// ---------------------------------------------------------------------------------------------
// Transfer, use records, export (design.md §5)

arcpool_status_t allocator::transfer(allocation& a, stream_handle to) {
  stream_ref target;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(to, &target));
  ARCPOOL_RETURN_IF_ERROR(check_not_capturing(target, "transfer"));
  std::lock_guard<std::mutex> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(check_usable(a, "transfer"));
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
  stats::count(stats_.transfers);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::record_use(allocation& a, stream_handle s, uint32_t flags) {
  if ((flags & ~uint32_t{ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION}) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown record_use flags 0x%x", flags);
  }
  stream_ref user;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &user));
  ARCPOOL_RETURN_IF_ERROR(check_not_capturing(user, "record_use"));
  std::lock_guard<std::mutex> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(check_usable(a, "record_use"));
  if (user.id == a.current.id) return ARCPOOL_STATUS_SUCCESS;  // its order already covers it
  use_record record;
  // An unregistered stream may be gone by deallocation time: fence it now (§6), unless the
  // caller guarantees it outlives the deallocation. Another thread cannot fence a per-thread
  // default stream: fence it now for them in any case.
  record.at_deallocation =
      user.provably_alive() || (flags & ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION) != 0;
  if (!user.provably_alive() &&
      (!record.at_deallocation || user.kind == stream_kind::per_thread_default)) {
    ARCPOOL_RETURN_IF_ERROR(take_fence(user, &record.fence));
  }
  record.stream = std::move(user);
  auto same = std::find_if(a.uses.begin(), a.uses.end(),
                           [&](const use_record& u) { return u.stream.id == record.stream.id; });
  if (same != a.uses.end()) {
    *same = std::move(record);
  } else {
    a.uses.push_back(std::move(record));
  }
  stats::count(stats_.use_records);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::export_memory(allocation& a, void** out) {
  std::lock_guard<std::mutex> lock(a.mutex);
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(a, a.owners.can_deallocate(false), "export"));
  if (a.placement.alignment > kPoolAlignment) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "export of %s: its alignment %zu exceeds the pool's, so its data pointer is not "
                "the pool's pointer",
                a.describe().c_str(), a.placement.alignment);
  }
  if (a.current.retired()) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "export of %s: its current stream was destroyed or unregistered; transfer it to "
                "a live stream first",
                a.describe().c_str());
  }
  if (!a.current.reachable()) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "export of %s: its current stream is another thread's per-thread default stream, "
                "which this thread cannot name; export it on that thread or transfer it first",
                a.describe().c_str());
  }
  fence_list fences;
  if (a.placement.size > 0) {
    ARCPOOL_RETURN_IF_ERROR(check_not_capturing(a.current, "export"));
    ARCPOOL_RETURN_IF_ERROR(collect_fences(a, nullptr, a.current.id, &fences));
  }
  // The waits first: if one fails nothing has changed.
  ARCPOOL_RETURN_IF_ERROR(wait_all(a.current.handle, fences));
  ARCPOOL_RETURN_IF_ERROR(ownership_failure(a, a.owners.accept_export(), "export"));
  a.uses.clear();
  stats::count(stats_.exports);
  nvtx::forget_region(a.placement.data);
  if (!a.external()) {
    stats_.bytes_in_use.sub(a.placement.size);
    stats_.allocations_in_use.sub(1);
    stats_.bytes_held.sub(a.placement.held_bytes);
  }
  *out = a.placement.base;
  return ARCPOOL_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// Pool maintenance and stats

arcpool_status_t allocator::trim(size_t keep_bytes) {
  flush_caches(/*include_legacy=*/true, /*synchronize=*/true);
  ARCPOOL_RETURN_IF_ERROR(reclaimer_.drain());
  // cudaMemPoolTrimTo: "Allocations that have been asynchronously freed but whose completion
  // has not been observed on the host (eg. by a synchronize) can count as outstanding." So
  // observe the frees queued on arcpool's streams first (not capturing ones: synchronizing
  // those would invalidate the capture), as PyTorch's cudaMallocAsync backend does before its
  // trim.
  synchronize_known_streams();
  return driver_->pool_trim(keep_bytes);
}

void allocator::synchronize_known_streams() {
  streams_.for_each([&](stream_entry& entry) {
    entry.with_alive([&](stream_handle h) {
      bool capturing = true;
      if (driver_->stream_is_capturing(h, &capturing) == ARCPOOL_STATUS_SUCCESS && !capturing) {
        driver_->stream_synchronize(h);
      }
      return ARCPOOL_STATUS_SUCCESS;
    });
  });
}

void allocator::read_stats(arcpool_stats_t* out) const {
  stats_.read(driver_->pool_query(), out);
}

}  // namespace arcpool::detail
