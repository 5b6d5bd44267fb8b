#include "api/default_allocators.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "support/shards.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

struct default_table {
  /// Creation, replacement and reclamation.
  std::mutex mutex;
  std::map<int, allocator*> by_device;  // each holds one reference
  /// by_device's allocators of the first kLockFreeDevices devices, for lookups without the
  /// mutex or a reference (default_lookup).
  std::atomic<allocator*> published[kLockFreeDevices] = {};
  /// Lookups in progress, per thread shard (shards.hpp).
  padded<std::atomic<int64_t>> lookups[kShards];
  /// Replaced published allocators, each still holding the table's reference until no lookup
  /// that may have found it is in progress (reclaim_retired). Under the mutex.
  std::vector<allocator*> retired;
  std::atomic<bool> retired_pending{false};
};

// Leaked on purpose, with its allocators: frameworks free by pointer during their own exit.
default_table& table() {
  static auto* t = new default_table();
  return *t;
}

/// Releases the retired allocators if no lookup is in progress in any shard; else leaves them
/// to the end of a lookup in progress: its end reads retired_pending after its count went down,
/// and this scan reads the counts after retired_pending went up (both sequentially
/// consistent), so one of the two sees the other.
void reclaim_retired(default_table& t) noexcept {
  std::vector<allocator*> done;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (t.retired.empty()) return;
    // Each was unpublished before this scan: a lookup that found one counted itself before
    // (sequentially consistent, default_lookup), so its shard reads nonzero until it ended.
    for (const auto& shard : t.lookups) {
      if (shard.value.load(std::memory_order_seq_cst) != 0) return;
    }
    done.swap(t.retired);
    t.retired_pending.store(false, std::memory_order_seq_cst);
  }
  // Torn down by the janitor: this thread may be an allocation's, or a capture's.
  for (allocator* a : done)
    a->release_elsewhere();
}

/// ARCPOOL_PEER_ACCESS=1: every device that can reach a default allocator's device may use its
/// memory, as frameworks' peer copies need (PyTorch's cudaDeviceEnablePeerAccess leaves pools
/// alone). 0, empty or unset: no peer. Anything else is refused: a value read as "off" would
/// show up only as a peer's fault.
arcpool_status_t peer_access_from_environment(bool* out) {
  const char* value = std::getenv("ARCPOOL_PEER_ACCESS");
  *out = value != nullptr && std::strcmp(value, "1") == 0;
  if (value == nullptr || *value == '\0' || *out || std::strcmp(value, "0") == 0) {
    return ARCPOOL_STATUS_SUCCESS;
  }
  return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "ARCPOOL_PEER_ACCESS=%s: expected 0 or 1", value);
}

}  // namespace

default_lookup::default_lookup(int device) noexcept {
  if (device < 0 || device >= kLockFreeDevices) return;
  default_table& t = table();
  shard_ = &t.lookups[thread_shard().index].value;
  shard_->fetch_add(1, std::memory_order_seq_cst);
  found_ = t.published[device].load(std::memory_order_seq_cst);
}

default_lookup::~default_lookup() {
  if (shard_ == nullptr) return;
  shard_->fetch_sub(1, std::memory_order_seq_cst);
  default_table& t = table();
  if (t.retired_pending.load(std::memory_order_seq_cst)) reclaim_retired(t);
}

arcpool_status_t default_allocator(int device, allocator** out, bool create) {
  if (device < 0) return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "device %d", device);
  {
    default_lookup lookup(device);
    if (allocator* a = lookup.found()) {
      a->retain();
      *out = a;
      return ARCPOOL_STATUS_SUCCESS;
    }
  }
  // The lookup's table is the published one: a device it covers has none (or one being created,
  // which a query need not wait for). Never waits on a creation there.
  if (!create && device < kLockFreeDevices) {
    *out = nullptr;
    return ARCPOOL_STATUS_SUCCESS;
  }
  default_table& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (!create) {
    const auto it = t.by_device.find(device);
    *out = it == t.by_device.end() ? nullptr : it->second;
    if (*out != nullptr) (*out)->retain();
    return ARCPOOL_STATUS_SUCCESS;
  }
  allocator*& slot = t.by_device[device];
  if (slot == nullptr) {
    allocator_config config;
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.device = device;
    ARCPOOL_RETURN_IF_ERROR(resolve_options(&options, &config));
    ARCPOOL_RETURN_IF_ERROR(peer_access_from_environment(&config.driver.all_reachable_peers));
    ARCPOOL_RETURN_IF_ERROR(allocator::create(config, &slot));
    if (device < kLockFreeDevices) t.published[device].store(slot, std::memory_order_seq_cst);
  }
  slot->retain();  // the caller's: a concurrent set_default_allocator may drop the table's
  *out = slot;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t set_default_allocator(int device, allocator* a) {
  if (device < 0) return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "device %d", device);
  if (a != nullptr && a->drv().device() != device) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "allocator serves device %d, not device %d",
                a->drv().device(), device);
  }
  default_table& t = table();
  allocator* previous = nullptr;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    const bool published = device < kLockFreeDevices;
    // The device's slot, and room to retire the previous allocator, first: both may allocate,
    // and a failure must change nothing (nor keep the reference taken below).
    try {
      t.by_device.try_emplace(device, nullptr);
      if (published) t.retired.reserve(t.retired.size() + 1);
    } catch (const std::bad_alloc&) {
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
                  "no host memory to replace device %d's default allocator", device);
    }
    if (a != nullptr) a->retain();
    previous = std::exchange(t.by_device[device], a);  // the slot is there: allocates nothing
    if (published) {
      t.published[device].store(a, std::memory_order_seq_cst);
      // A lookup in progress may have found it: retired, released once none is.
      if (previous != nullptr) {
        t.retired.push_back(previous);
        t.retired_pending.store(true, std::memory_order_seq_cst);
        previous = nullptr;
      }
    }
  }
  if (previous != nullptr) previous->release_elsewhere();  // "never blocks"
  reclaim_retired(t);
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace arcpool::detail
