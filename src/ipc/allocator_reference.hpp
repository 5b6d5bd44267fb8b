// A retained allocator handle, released when it goes (design.md §14).
#pragma once

#include "arcpool/arcpool.h"

namespace arcpool::detail::ipc {

/// One handle reference to an allocator (taken with arcpool_allocator_retain by the owner),
/// released by the destructor. The exporter and the importer declare it first, so that it goes
/// last: after every member that calls the allocator's driver.
class allocator_reference {
 public:
  explicit allocator_reference(arcpool_allocator_t* a) noexcept : a_(a) {}
  ~allocator_reference() { arcpool_allocator_destroy(a_); }
  allocator_reference(const allocator_reference&) = delete;
  allocator_reference& operator=(const allocator_reference&) = delete;

  arcpool_allocator_t* get() const noexcept { return a_; }

 private:
  arcpool_allocator_t* const a_;
};

}  // namespace arcpool::detail::ipc
