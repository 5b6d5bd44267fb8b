#include "api/default_allocators.hpp"

#include <map>
#include <mutex>

#include "support/status.hpp"

namespace arcpool::detail {
namespace {

struct default_table {
  std::mutex mutex;
  std::map<int, allocator*> by_device;  // each holds one reference
};

// Leaked on purpose, with its allocators: frameworks free by pointer during their own exit.
default_table& table() {
  static auto* t = new default_table();
  return *t;
}

}  // namespace

arcpool_status_t default_allocator(int device, allocator** out) {
  if (device < 0) return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "device %d", device);
  std::lock_guard<std::mutex> lock(table().mutex);
  allocator*& slot = table().by_device[device];
  if (slot == nullptr) {
    allocator_config config;
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.device = device;
    ARCPOOL_RETURN_IF_ERROR(resolve_options(&options, &config));
    ARCPOOL_RETURN_IF_ERROR(allocator::create(config, &slot));
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
  if (a != nullptr) a->retain();
  allocator* previous = nullptr;
  {
    std::lock_guard<std::mutex> lock(table().mutex);
    previous = std::exchange(table().by_device[device], a);
  }
  if (previous != nullptr) previous->release();
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace arcpool::detail
