// The owner count and ownership state of an allocation in one atomic word (design.md §3), so
// that every transition of the state table is a single compare-and-swap.
#pragma once

#include <atomic>
#include <cstdint>

#include "arcpool/arcpool.h"

namespace arcpool::detail {

/// Outcome of an ownership transition, before it is turned into a status with a message.
enum class ownership_result : uint8_t {
  ok,                   ///< the transition happened
  not_owner,            ///< NOT_OWNER: owner count 0, or other owners remain
  already_deallocated,  ///< ALREADY_DEALLOCATED: DEALLOCATED or EXPORTED
  overflow,             ///< the owner count would overflow
};

/// Owner count P and state. Word layout: state in the high 32 bits, P in the low 32 bits.
class ownership {
 public:
  using state = arcpool_allocation_state_t;

  /// A consistent reading of state and owner count.
  struct snapshot {
    state st;
    uint32_t owners;
  };

  /// A live allocation with one owner.
  ownership() noexcept : word_(pack(ARCPOOL_ALLOCATION_LIVE, 1)) {}

  /// A live allocation with `owners` owners (at least 1): how a test reaches the owner count's
  /// limit without 2^32 preserves.
  static ownership live_with_owners(uint32_t owners) noexcept { return ownership(owners); }

  snapshot load() const noexcept { return unpack(word_.load(std::memory_order_acquire)); }

  /// LIVE: P += 1. UNOWNED: not_owner (never resurrects). Else already_deallocated.
  ownership_result preserve() noexcept;

  /// LIVE: P -= 1, `was_last` when it reached 0 (→ UNOWNED; acq_rel, so the last owner sees
  /// every other owner's writes). UNOWNED: not_owner (never wraps). Else already_deallocated.
  ownership_result discard(bool* was_last) noexcept;

  /// Checks whether the deallocation would be accepted, without changing anything.
  ownership_result can_deallocate(bool force) const noexcept;

  /// Accepts the one deallocation: LIVE with P == 1 (or any P with `force`), or UNOWNED,
  /// → DEALLOCATED with P = 0. Else not_owner / already_deallocated.
  ownership_result accept_deallocation(bool force) noexcept;

  /// The deallocation's fast path: LIVE with P == 1 → DEALLOCATED with P = 0, in one
  /// compare-and-swap (acq_rel, as accept_deallocation). False, with nothing changed, in any
  /// other state (accept_deallocation tells which).
  bool end_sole_ownership() noexcept {
    uint64_t sole = pack(ARCPOOL_ALLOCATION_LIVE, 1);
    return word_.compare_exchange_strong(sole, pack(ARCPOOL_ALLOCATION_DEALLOCATED, 0),
                                         std::memory_order_acq_rel, std::memory_order_relaxed);
  }

  /// Accepts an export: as a non-forced deallocation, but → EXPORTED.
  ownership_result accept_export() noexcept;

  /// The last reference went while LIVE or UNOWNED: → DEALLOCATED (an implicit free).
  /// Returns false if the allocation was already deallocated or exported.
  bool accept_implicit_free() noexcept;

  /// LIVE with P == 1.
  bool is_terminal() const noexcept {
    const snapshot s = load();
    return s.st == ARCPOOL_ALLOCATION_LIVE && s.owners == 1;
  }

 private:
  /// Why preserve or discard refuses `word`: its state is not LIVE, or P is at its maximum.
  static ownership_result refused(uint64_t word) noexcept;

  static constexpr uint64_t pack(state st, uint32_t owners) noexcept {
    return (static_cast<uint64_t>(st) << 32) | owners;
  }
  static constexpr snapshot unpack(uint64_t word) noexcept {
    return {static_cast<state>(word >> 32), static_cast<uint32_t>(word)};
  }
  static ownership_result check_deallocation(snapshot s, bool force) noexcept;
  ownership_result end_ownership(bool force, state to) noexcept;

  explicit ownership(uint32_t owners) noexcept : word_(pack(ARCPOOL_ALLOCATION_LIVE, owners)) {}

  std::atomic<uint64_t> word_;
};

// Inline: preserve and discard are the whole of the preserve + discard pair, and the checks and
// the deallocation are the fast path's.

inline ownership_result ownership::check_deallocation(snapshot s, bool force) noexcept {
  switch (s.st) {
    case ARCPOOL_ALLOCATION_LIVE:
      return (s.owners == 1 || force) ? ownership_result::ok : ownership_result::not_owner;
    case ARCPOOL_ALLOCATION_UNOWNED:
      return ownership_result::ok;
    default:
      return ownership_result::already_deallocated;
  }
}

inline ownership_result ownership::can_deallocate(bool force) const noexcept {
  return check_deallocation(load(), force);
}

inline ownership_result ownership::end_ownership(bool force, state to) noexcept {
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

inline ownership_result ownership::accept_deallocation(bool force) noexcept {
  return end_ownership(force, ARCPOOL_ALLOCATION_DEALLOCATED);
}

inline ownership_result ownership::accept_export() noexcept {
  return end_ownership(false, ARCPOOL_ALLOCATION_EXPORTED);
}

inline bool ownership::accept_implicit_free() noexcept {
  return end_ownership(true, ARCPOOL_ALLOCATION_DEALLOCATED) == ownership_result::ok;
}

// LIVE is state 0, so a LIVE word is its owner count: one unsigned compare tells LIVE (below
// 2^32) with, for preserve, room for one more owner (below UINT32_MAX) and, for discard, an
// owner to remove (at least 1).
static_assert(ARCPOOL_ALLOCATION_LIVE == 0, "a LIVE word is its owner count");

inline ownership_result ownership::refused(uint64_t word) noexcept {
  const snapshot s = unpack(word);
  if (s.st == ARCPOOL_ALLOCATION_UNOWNED) return ownership_result::not_owner;
  if (s.st != ARCPOOL_ALLOCATION_LIVE) return ownership_result::already_deallocated;
  return s.owners == UINT32_MAX ? ownership_result::overflow : ownership_result::not_owner;
}

inline ownership_result ownership::preserve() noexcept {
  uint64_t word = word_.load(std::memory_order_relaxed);
  for (;;) {
    if (word >= UINT32_MAX) return refused(word);
    // Relaxed success: adding a claim publishes nothing; the caller already holds one.
    if (word_.compare_exchange_weak(word, word + 1, std::memory_order_relaxed)) {
      return ownership_result::ok;
    }
  }
}

inline ownership_result ownership::discard(bool* was_last) noexcept {
  uint64_t word = word_.load(std::memory_order_relaxed);
  for (;;) {
    if (word - 1 >= UINT32_MAX) return refused(word);  // LIVE with P >= 1
    const bool last = word == 1;
    const uint64_t next = last ? pack(ARCPOOL_ALLOCATION_UNOWNED, 0) : word - 1;
    if (word_.compare_exchange_weak(word, next, std::memory_order_acq_rel,
                                    std::memory_order_relaxed)) {
      *was_last = last;
      return ownership_result::ok;
    }
  }
}

}  // namespace arcpool::detail
