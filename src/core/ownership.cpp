#include "core/ownership.hpp"

namespace arcpool::detail {

ownership_result ownership::preserve() noexcept {
  uint64_t word = word_.load(std::memory_order_relaxed);
  for (;;) {
    const snapshot s = unpack(word);
    if (s.st == ARCPOOL_ALLOCATION_UNOWNED) return ownership_result::not_owner;
    if (s.st != ARCPOOL_ALLOCATION_LIVE) return ownership_result::already_deallocated;
    if (s.owners == UINT32_MAX) return ownership_result::overflow;
    // Relaxed success: adding a claim publishes nothing; the caller already holds one.
    if (word_.compare_exchange_weak(word, word + 1, std::memory_order_relaxed)) {
      return ownership_result::ok;
    }
  }
}

ownership_result ownership::discard(bool* was_last) noexcept {
  uint64_t word = word_.load(std::memory_order_relaxed);
  for (;;) {
    const snapshot s = unpack(word);
    if (s.st == ARCPOOL_ALLOCATION_UNOWNED) return ownership_result::not_owner;
    if (s.st != ARCPOOL_ALLOCATION_LIVE) return ownership_result::already_deallocated;
    const bool last = s.owners == 1;
    const uint64_t next = last ? pack(ARCPOOL_ALLOCATION_UNOWNED, 0) : word - 1;
    if (word_.compare_exchange_weak(word, next, std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
      *was_last = last;
      return ownership_result::ok;
    }
  }
}

ownership_result ownership::check_deallocation(snapshot s, bool force) noexcept {
  switch (s.st) {
    case ARCPOOL_ALLOCATION_LIVE:
      return (s.owners == 1 || force) ? ownership_result::ok : ownership_result::not_owner;
    case ARCPOOL_ALLOCATION_UNOWNED:
      return ownership_result::ok;
    default:
      return ownership_result::already_deallocated;
  }
}

ownership_result ownership::can_deallocate(bool force) const noexcept {
  return check_deallocation(load(), force);
}

ownership_result ownership::end_ownership(bool force, state to) noexcept {
  uint64_t word = word_.load(std::memory_order_acquire);
  for (;;) {
    const ownership_result r = check_deallocation(unpack(word), force);
    if (r != ownership_result::ok) return r;
    if (word_.compare_exchange_weak(word, pack(to, 0), std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      return ownership_result::ok;
    }
  }
}

ownership_result ownership::accept_deallocation(bool force) noexcept {
  return end_ownership(force, ARCPOOL_ALLOCATION_DEALLOCATED);
}

ownership_result ownership::accept_export() noexcept {
  return end_ownership(false, ARCPOOL_ALLOCATION_EXPORTED);
}

bool ownership::accept_implicit_free() noexcept {
  return end_ownership(true, ARCPOOL_ALLOCATION_DEALLOCATED) == ownership_result::ok;
}

}  // namespace arcpool::detail
