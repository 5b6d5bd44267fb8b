// The per-device allocators serving the raw-pointer entry points (design.md §9).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/allocator.hpp"

namespace arcpool::detail {

/// Devices whose default allocator a default_lookup finds without a lock or a reference (every
/// device there is in practice); a larger ordinal takes the table's mutex and a reference.
inline constexpr int kLockFreeDevices = 64;

/// The default allocator of a device, found without the table's mutex and without a reference
/// of the caller's: while the lookup lasts, an allocator it found stays alive even if
/// set_default_allocator replaces it meanwhile (the replaced one keeps the table's reference
/// until no lookup is in progress in any thread shard). What the raw-pointer entry points of
/// frameworks take on every call: one uncontended locked add and subtract on the thread's own
/// shard, instead of a process-wide mutex and two locked updates of the allocator's shared
/// reference count.
class default_lookup {
 public:
  explicit default_lookup(int device) noexcept;
  ~default_lookup();
  default_lookup(const default_lookup&) = delete;
  default_lookup& operator=(const default_lookup&) = delete;

  /// The device's default allocator, or null: not created yet, or a device at or beyond
  /// kLockFreeDevices (default_allocator then creates or finds it).
  allocator* found() const noexcept { return found_; }

 private:
  std::atomic<int64_t>* shard_ = nullptr;  ///< the lookup's count, null when none was taken
  allocator* found_ = nullptr;
};

/// The allocator serving `device`, created with default options on first use (unless
/// `create` is false: then null when there is none), with a new reference the caller releases.
arcpool_status_t default_allocator(int device, allocator** out, bool create = true);

/// Replaces `device`'s default allocator (null: a fresh default one on next use). Keeps its
/// own reference. Never waits: the previous allocator loses the table's reference at once, or,
/// while a default_lookup is in progress, at the end of the first lookup or replacement that
/// finds none.
arcpool_status_t set_default_allocator(int device, allocator* a);

/// Runs `fn(allocator&)` on `device`'s default allocator, created on first use: through a
/// default_lookup, else with a reference of its own.
template <class F>
arcpool_status_t with_default_allocator(int device, F&& fn) {
  {
    default_lookup lookup(device);
    if (allocator* a = lookup.found()) return fn(*a);
  }
  allocator* a = nullptr;
  ARCPOOL_RETURN_IF_ERROR(default_allocator(device, &a));
  const arcpool_status_t status = fn(*a);
  a->release();
  return status;
}

}  // namespace arcpool::detail
