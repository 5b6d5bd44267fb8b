// An open-addressing hash table of address ranges keyed by their start: an exact start is found
// in one probe sequence, and an interior address by a scan of the table (core/pointer_map.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace arcpool::detail {

/// Ranges [start, start + size) with a non-zero start and size, each with a value pointer.
/// Linear probing with backward-shift deletion (no tombstones: a probe sequence never grows
/// with erased entries). It grows to keep at most half its slots full and never shrinks, so an
/// insert after an erase never allocates. Not thread-safe: the owner locks.
template <class T>
class address_table {
 public:
  /// Where an entry sits; `npos` when absent.
  static constexpr size_t npos = SIZE_MAX;

  /// Adds or replaces the entry of `start`. False, with the table unchanged, when it had to
  /// grow and no host memory was left. One probe sequence, to the entry or the first gap.
  bool insert(uintptr_t start, size_t size, T* value) noexcept {
    if (count_ >= limit_ && !grow()) {
      // No room to add: replacing needs none.
      const size_t i = find_start(start);
      if (i == npos) return false;
      slots_[i] = slot{start, size, value};
      return true;
    }
    place(start, size, value);
    return true;
  }

  /// Puts back an entry erased earlier, as insert adds one, except that when the table would
  /// have to grow and no host memory is left, the entry goes in over the half-full limit while
  /// another slot stays free (probe sequences still end at a gap): whoever took it out relies on
  /// putting it back. False, with the table unchanged, only when all but one slot are full.
  bool put_back(uintptr_t start, size_t size, T* value) noexcept {
    if (count_ >= limit_ && !grow() && count_ + 1 >= capacity()) return false;
    place(start, size, value);
    return true;
  }

  /// The entry whose range contains `address`: its start's probe sequence first, then, for an
  /// interior address, a scan of every slot. npos when none does.
  size_t locate(uintptr_t address) const noexcept {
    if (const size_t i = find_start(address); i != npos) return i;
    for (size_t i = 0; i < capacity(); ++i) {
      const slot& s = slots_[i];
      if (s.start != 0 && address - s.start < s.size) return i;
    }
    return npos;
  }

  /// The entry that starts exactly at `start` (its probe sequence only); npos when none does.
  size_t find_start(uintptr_t start) const noexcept {
    if (!slots_ || start == 0) return npos;
    for (size_t i = home(start);; i = (i + 1) & mask_) {
      if (slots_[i].start == start) return i;
      if (slots_[i].start == 0) return npos;
    }
  }

  /// The value of the entry at `i` (from locate or find_start).
  T* value_at(size_t i) const noexcept { return slots_[i].value; }

  /// Removes the entry at `i` (from locate), moving later entries of its cluster back so that
  /// no probe sequence has a gap.
  void erase(size_t i) noexcept {
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; slots_[j].start != 0; j = (j + 1) & mask_) {
      const size_t k = home(slots_[j].start);
      // The entry at j may fill the hole unless its home lies cyclically in (hole, j].
      const bool stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
      if (stays) continue;
      slots_[hole] = slots_[j];
      hole = j;
    }
    slots_[hole] = slot{};
    --count_;
  }

  /// Entries present.
  size_t size() const noexcept { return count_; }

 private:
  struct slot {
    uintptr_t start = 0;  ///< 0: empty
    size_t size = 0;
    T* value = nullptr;
  };
  static constexpr size_t kInitialSlots = 256;

  size_t capacity() const noexcept { return slots_ ? mask_ + 1 : 0; }
  /// Adds or replaces the entry of `start`, in a table with a free slot. One probe sequence.
  void place(uintptr_t start, size_t size, T* value) noexcept {
    size_t i = home(start);
    while (slots_[i].start != 0 && slots_[i].start != start)
      i = (i + 1) & mask_;
    if (slots_[i].start == 0) ++count_;
    slots_[i] = slot{start, size, value};
  }
  /// Fibonacci hashing of the start: the low bits of device addresses are mostly alignment.
  size_t home(uintptr_t start) const noexcept {
    return static_cast<size_t>((static_cast<uint64_t>(start) * 0x9E3779B97F4A7C15ull) >> 32) &
           mask_;
  }
  /// Doubles the slots (kInitialSlots at first) and reinserts every entry. Out of line, so
  /// that an insert's common case keeps a short prologue.
  [[gnu::noinline, gnu::cold]] bool grow() noexcept {
    const size_t old_capacity = capacity();
    const size_t capacity = old_capacity == 0 ? kInitialSlots : old_capacity * 2;
    std::unique_ptr<slot[]> fresh(new (std::nothrow) slot[capacity]);
    if (!fresh) return false;
    std::unique_ptr<slot[]> old = std::move(slots_);
    slots_ = std::move(fresh);
    mask_ = capacity - 1;
    limit_ = capacity / 2;
    for (size_t i = 0; i < old_capacity; ++i) {
      if (old[i].start == 0) continue;
      size_t j = home(old[i].start);
      while (slots_[j].start != 0)
        j = (j + 1) & mask_;
      slots_[j] = old[i];
    }
    return true;
  }

  std::unique_ptr<slot[]> slots_;
  size_t mask_ = 0;
  size_t count_ = 0;
  size_t limit_ = 0;  ///< entries the slots hold at most (half of them; 0 before the first)
};

}  // namespace arcpool::detail
