#include "core/allocation.hpp"

#include <cstdio>

#include "core/allocator.hpp"
#include "core/reclaimer.hpp"

namespace arcpool::detail {

allocation::allocation(allocator& owner_allocator, const params& p)
    : arcpool_allocation(this, 0, p.size, false),
      owner(owner_allocator),
      placement(p),
      current(placement.origin) {}

allocation::~allocation() {
  delete deferred_free;  // null once the last reference queued it
}

void allocation::release() noexcept {
  if (refs.decrement()) owner.on_last_reference(this);
}

std::string allocation::describe() const {
  char text[96];
  std::snprintf(text, sizeof(text), "allocation #%llu (%zu bytes at %p)",
                static_cast<unsigned long long>(placement.serial), placement.size, placement.data);
  return text;
}

void release_view(arcpool_allocation* handle) noexcept {
  if (handle->view_refs.decrement()) {
    allocation* record = handle->record;
    delete handle;
    record->release();
  }
}

void retain_handle(arcpool_allocation* handle) noexcept {
  if (handle->is_view) {
    handle->view_refs.increment();
  } else {
    handle->record->retain();
  }
}

}  // namespace arcpool::detail
