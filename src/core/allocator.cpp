// The allocator's lifetime, its streams, the fast path's caches and pool maintenance. The
// operations live beside it: allocate.cpp, deallocate.cpp, transfer.cpp.
#include "core/allocator.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/janitor.hpp"
#include "support/process_exit.hpp"
#include "support/status.hpp"

namespace arcpool::detail {

// ---------------------------------------------------------------------------------------------
// Lifetime

namespace {

/// The history size ARCPOOL_HISTORY asks for (0 when unset).
arcpool_status_t history_entries_from_environment(size_t* out) {
  *out = 0;
  const char* text = std::getenv("ARCPOOL_HISTORY");
  if (text == nullptr || *text == '\0') return ARCPOOL_STATUS_SUCCESS;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(text, &end, 10);
  // strtoull skips leading spaces and wraps a minus sign: " -1" would read as 2^64 - 1.
  if (errno != 0 || *end != '\0' || std::strchr(text, '-') != nullptr || n > SIZE_MAX) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "ARCPOOL_HISTORY=%s is not a number of history entries", text);
  }
  *out = static_cast<size_t>(n);
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace

arcpool_status_t allocator::create(const allocator_config& config, allocator** out) {
  allocator_config resolved = config;
  if (resolved.history_entries == 0) {
    ARCPOOL_RETURN_IF_ERROR(history_entries_from_environment(&resolved.history_entries));
  }
  if (resolved.history_entries > history::max_entries()) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "a memory history of %zu entries (history_entries or ARCPOOL_HISTORY) is more "
                "than one can hold (%zu)",
                resolved.history_entries, history::max_entries());
  }
  std::unique_ptr<driver> drv;
  ARCPOOL_RETURN_IF_ERROR(make_driver(resolved.driver, &drv));
  // The log's path before the allocator: making it may throw (no host memory).
  std::string log_file;
  if (const char* path = std::getenv("ARCPOOL_LOG"); path != nullptr && *path != '\0') {
    static std::atomic<unsigned> opened{0};  // allocators that opened an ARCPOOL_LOG file
    log_file = numbered_log_path(path, opened.fetch_add(1));
  }
  auto* a = new allocator(resolved, std::move(drv));
  if (!log_file.empty()) {
    if (arcpool_status_t status = a->log_.open(log_file.c_str());
        status != ARCPOOL_STATUS_SUCCESS) {
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
      history_(config.history_entries),
      reclaimer_(*driver_, events_, stats_, history_, config.before_free,
                 config.before_free_user_data) {
  // A hard limit is enforced on the exact total of held bytes.
  hard_limit_.store(config_.hard_limit_bytes, std::memory_order_relaxed);
  if (config_.hard_limit_bytes != 0) stats_.make_bytes_held_exact();
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

void allocator::release_elsewhere() noexcept {
  if (!refs_.decrement()) return;
  closing_.store(true, std::memory_order_seq_cst);
  janitor_adopt(this);
}

// ---------------------------------------------------------------------------------------------
// Streams

namespace {

stream_kind kind_of(stream_handle s) {
  if (s == legacy_default_stream() || s == legacy_stream_alias()) {
    return stream_kind::legacy_default;
  }
  return s == per_thread_default_stream() ? stream_kind::per_thread_default
                                          : stream_kind::application;
}

}  // namespace

arcpool_status_t allocator::resolve_stream_slow(stream_handle s, stream_ref* out) {
  const uint64_t stamp = streams_.stamp();
  out->handle = s;
  out->kind = kind_of(s);
  out->thread = out->kind == stream_kind::per_thread_default ? this_thread_serial() : 0;
  // Capture first: whether cudaStreamGetId is legal on a capturing stream is undocumented
  // (CCCL treats the query as invalidating the capture), so arcpool does not ask then.
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s, &capturing));
  if (capturing) return resolve_capturing_stream(s, out);
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_id(s, &out->id));
  if (out->kind == stream_kind::legacy_default) {
    // Its statistics row, before anything counts on it: every legacy stream_ref comes from here.
    stream_stats_.take_legacy(legacy_default_stream(), out->id, legacy_cache_.guard());
  }
  out->entry = out->kind == stream_kind::application ? streams_.find(out->id) : nullptr;
  if (out->kind == stream_kind::application && out->entry == nullptr) {
    // Known streams were checked once, when created or registered. A default stream handle
    // names the allocator's device's own stream: the device guard makes that device current.
    ARCPOOL_RETURN_IF_ERROR(check_stream_device(s));
  }
  if (out->entry != nullptr || out->kind != stream_kind::application) {
    stream_cache_line_of(s) = stream_cache_line{stamp, s, out->id, out->entry, out->kind};
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::check_stream_device(stream_handle s) {
  int device = 0;
  bool primary_context = true;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_device(s, &device, &primary_context));
  if (device == driver_->device()) {
    if (primary_context) return ARCPOOL_STATUS_SUCCESS;
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "stream %p belongs to a context of device %d other than its primary context (one "
                "made with cuCtxCreate, or a green context's): arcpool's events live in the "
                "primary context, and an event and the stream it is recorded on must be on the "
                "same CUDA context (cudaEventRecord); use a stream of the primary context",
                static_cast<void*>(s), device);
  }
  return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
              "stream %p belongs to device %d, and this allocator serves device %d: its pool's "
              "memory is ordered on device %d's streams (use device %d's allocator, "
              "arcpool_default_allocator_get(%d))",
              static_cast<void*>(s), device, driver_->device(), driver_->device(), device, device);
}

arcpool_status_t allocator::capturing_failure(const stream_ref& s, const char* what) {
  return fail(ARCPOOL_STATUS_UNSUPPORTED, "%s: stream %p (id %llu) is capturing a CUDA graph; %s",
              what, static_cast<void*>(s.handle), static_cast<unsigned long long>(s.id),
              driver_->supports_graphs()
                  ? "arcpool supports only allocate, deallocate, and transfers and use records "
                    "between streams of one capture there (docs/graphs.md)"
                  : "this driver builds no graphs, so arcpool supports nothing there");
}

arcpool_status_t allocator::create_stream(stream_handle* out) {
  stream_handle s = nullptr;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_create(&s));
  uint64_t id = 0;
  arcpool_status_t status = driver_->stream_id(s, &id);
  if (status == ARCPOOL_STATUS_SUCCESS) {
    try {
      streams_.add(std::make_unique<stream_entry>(s, id, /*created=*/true), stream_stats_);
    } catch (const std::bad_alloc&) {
      status = fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for stream %p's entry",
                    static_cast<void*>(s));
    }
  }
  if (status != ARCPOOL_STATUS_SUCCESS) {
    driver_->stream_destroy(s);  // the stream made for it goes again
    return status;
  }
  *out = s;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::synchronize_stream(stream_handle s) {
  // cudaErrorStreamCaptureUnsupported: "The operation is not permitted when the stream is
  // capturing", and the capture is invalidated (CUDA Runtime API, error types). Checked first.
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(driver_->stream_is_capturing(s, &capturing));
  if (capturing) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "stream_synchronize: stream %p is capturing a CUDA graph; synchronizing it "
                "would invalidate the capture (synchronize after cudaStreamEndCapture)",
                static_cast<void*>(s));
  }
  return driver_->stream_synchronize(s);
}

arcpool_status_t allocator::destroy_stream(stream_handle s) {
  stream_ref ref;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &ref));
  if (!ref.entry || !ref.entry->created()) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "stream %p was not created by this allocator (arcpool_stream_create)",
                static_cast<void*>(s));
  }
  ARCPOOL_RETURN_IF_ERROR(retire_stream(ref, "stream_destroy"));
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
  if (ref.entry) {  // already known: one more registration to withdraw
    ref.entry->add_registration();
    return ARCPOOL_STATUS_SUCCESS;
  }
  if (ref.capture_scoped()) {
    // Named by its handle for a capture only: its identity, cudaStreamGetId, is not asked
    // during a capture (resolve_stream_slow), and an entry under the capture's name would be
    // found by no one once the capture ended.
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "stream_register: stream %p is capturing a CUDA graph; register it before the "
                "capture or after it",
                static_cast<void*>(s));
  }
  streams_.add(std::make_unique<stream_entry>(s, ref.id, /*created=*/false), stream_stats_);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t allocator::unregister_stream(stream_handle s) {
  stream_ref ref;
  ARCPOOL_RETURN_IF_ERROR(resolve_stream(s, &ref));
  if (ref.entry && ref.entry->withdraw_registration()) return ARCPOOL_STATUS_SUCCESS;
  if (!ref.entry || ref.entry->created()) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "stream %p is not registered with this allocator",
                static_cast<void*>(s));
  }
  return retire_stream(ref, "stream_unregister");
}

arcpool_status_t allocator::retire_stream(const stream_ref& ref, const char* what) {
  // Before any call on it: the cache's frees and the final fence would land in the capture.
  ARCPOOL_RETURN_IF_ERROR(check_not_capturing(ref, what));
  stream_entry& entry = *ref.entry;
  if (!entry.claim_retirement()) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "%s: stream %p is being retired by another call, or was (destroyed or "
                "unregistered)",
                what, static_cast<void*>(ref.handle));
  }
  auto stays = [&] {
    entry.cache().reopen();
    entry.give_retirement_back();
  };
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  try {
    // Closed first, so that no free lands in the cache after its flush and before the final
    // fence; opened again if the fence cannot be recorded, the stream staying as it was.
    flush_cache(entry.cache(), ref.handle, /*close=*/true);
    status = entry.retire(events_);
  } catch (...) {
    stays();
    throw;
  }
  if (status != ARCPOOL_STATUS_SUCCESS) {
    stays();
    return status;
  }
  stream_stats_.retire(&entry.stats());
  streams_.remove(ref.id);
  return ARCPOOL_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// The fast path's caches

size_t allocator::flush_cache(block_cache& cache, stream_handle s, bool close) {
  int64_t blocks = 0;
  const size_t bytes = cache.drain(
      [&](void* p, size_t n) {
        ++blocks;
        history_.segment_free(p, s);
        // A free that fails is written off and counted, as a deferred free's is
        // (reclaimer::complete), so that a drain gives every block away and throws nothing:
        // the host driver queues the free as host work, which may find no host memory.
        arcpool_status_t status = ARCPOOL_STATUS_OUT_OF_MEMORY;
        try {
          status = driver_->pool_free(p, n, s);
        } catch (const std::bad_alloc&) {
        }
        stats_.count(status == ARCPOOL_STATUS_SUCCESS ? stat::frees : stat::reclaim_failures);
      },
      close);
  stats_.count(stat::cache_flushes, blocks);
  stats_.sub(stat::bytes_cached, static_cast<int64_t>(bytes));
  stats_.sub(stat::bytes_held, static_cast<int64_t>(bytes));
  return static_cast<size_t>(blocks);
}

void allocator::flush_caches(bool include_legacy, bool synchronize) {
  // Only streams alive and not capturing: a free must never land in someone's graph. The waits
  // come after the registry's and the streams' locks are released (wait_for_fences).
  fence_list flushed;
  auto flush = [&](block_cache& cache, stream_handle h, uint64_t id) {
    if (cache.bytes() == 0) return;  // nothing to give back: not even a query on the stream
    bool capturing = true;
    if (driver_->stream_is_capturing(h, &capturing) != ARCPOOL_STATUS_SUCCESS || capturing) {
      return;
    }
    // The frees ran once its fence completed: the pool may hand the blocks to anyone.
    if (flush_cache(cache, h, /*close=*/false) > 0 && synchronize)
      fence_to_wait_for(h, id, &flushed);
  };
  streams_.for_each([&](stream_entry& entry) {
    entry.with_alive([&](stream_handle h) {
      flush(entry.cache(), h, entry.id());
      return ARCPOOL_STATUS_SUCCESS;
    });
  });
  // The legacy stream's fence is only waited for here: its identity is never read.
  if (include_legacy) flush(legacy_cache_, legacy_default_stream(), 0);
  wait_for_fences(flushed);
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
  // Fenced under the registry's and each stream's lock, waited for once both are released:
  // waiting under them held up every stream's creation, registration and retirement (which
  // never block) until the busiest stream drained.
  fence_list fences;
  streams_.for_each([&](stream_entry& entry) {
    entry.with_alive([&](stream_handle h) {
      fence_to_wait_for(h, entry.id(), &fences);
      return ARCPOOL_STATUS_SUCCESS;
    });
  });
  wait_for_fences(fences);
}

void allocator::fence_to_wait_for(stream_handle h, uint64_t id, fence_list* out) noexcept {
  // Outside captures only: another thread may begin capturing `h` at any moment, and an event
  // recorded into its capture is no fence (record_outside_capture destroys it). Without host
  // memory for the fence (the host driver's record allocates, and so may the list), the stream
  // is not waited for, as when its record fails: a flush or a trim goes on.
  try {
    fence_ref f;
    bool capturing = false;
    if (events_.record_outside_capture(h, id, &f, &capturing) == ARCPOOL_STATUS_SUCCESS && f) {
      out->push_back(std::move(f));
    }
  } catch (const std::bad_alloc&) {
  }
}

void allocator::wait_for_fences(const fence_list& fences) {
  for (const fence_ref& f : fences)
    driver_->event_synchronize(f->event());
}

void allocator::read_stats(arcpool_stats_t* out) const {
  stats_.read(driver_->pool_query(), out);
}

}  // namespace arcpool::detail
