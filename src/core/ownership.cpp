#include "core/ownership.hpp"

namespace arcpool::detail {

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
