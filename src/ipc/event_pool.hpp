// Interprocess events (cudaEventInterprocess | cudaEventDisableTiming), kept apart from the
// allocator's event pool: they cost more, and another process holds their handles
// (design.md §14).
#pragma once

#include <mutex>
#include <vector>

#include "drivers/driver.hpp"

namespace arcpool::detail::ipc {

/// A free list of interprocess events of one driver.
class ipc_event_pool {
 public:
  /// An event and the handle another process opens it with.
  struct entry {
    event_handle event = nullptr;
    ipc_event_data data{};
  };

  explicit ipc_event_pool(driver& d) noexcept : drv_(d) {}
  ~ipc_event_pool();
  ipc_event_pool(const ipc_event_pool&) = delete;
  ipc_event_pool& operator=(const ipc_event_pool&) = delete;

  /// A free event, or a new one.
  arcpool_status_t take(entry* out);
  /// Returns an event no other process will use again; destroys it when the host has no memory
  /// to keep it.
  void give_back(const entry& e) noexcept;

 private:
  driver& drv_;
  std::mutex mu_;
  std::vector<entry> free_;
};

}  // namespace arcpool::detail::ipc
