// The importing end of an IPC connection (arcpool_ipc_importer_t, design.md §14).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "arcpool/ipc.h"
#include "ipc/allocator_reference.hpp"
#include "ipc/channel.hpp"
#include "ipc/event_pool.hpp"

namespace arcpool::detail::ipc {

/// Another process's pool, imported on one allocator's device, and the allocations it sends.
/// Each import holds a reference: the connection closes when the user's handle and every
/// import are gone.
class importer {
 public:
  /// Greets the exporter, receives the pool and imports it.
  static arcpool_status_t create(arcpool_allocator_t* allocator, int fd, importer** out);

  /// arcpool_ipc_receive.
  arcpool_status_t receive(arcpool_stream_t stream, arcpool_allocation_t** out);
  /// The user's handle goes. No receive follows: the allocations sent and not yet received
  /// are refused now, and those read later (while imports are released, and at the teardown)
  /// as they are read, so that the exporter's claims on them go while this process lives.
  void destroy() noexcept;

 private:
  /// What arcpool_import would refuse of `stream` (another device's, a non-primary context's:
  /// INVALID_ARGUMENT), and UNSUPPORTED while it captures a graph (a receive's wait would cross
  /// its boundary): checked before an allocation is taken, so that a refusal leaves it queued.
  arcpool_status_t check_stream(arcpool_stream_t stream);
  /// What the on-free callback of one import needs.
  struct import_ctx {
    importer* owner;
    uint64_t id;
  };

  importer(arcpool_allocator_t* allocator, int fd);
  ~importer();

  /// arcpool no longer uses import `ctx->id` at `p`: frees it, records an event after the
  /// free and tells the exporter (whose free waits on that event).
  static void on_free(void* p, size_t size, void* ctx) noexcept;
  void release_import(void* p, uint64_t id) noexcept;
  /// The exporter no longer needs the release event of `id`.
  void recycle(uint64_t id) noexcept;
  /// Acts on a message from the exporter that is not the allocation a receive waits for: an
  /// acknowledged release event is recycled, a goodbye ends the connection, an allocation waits
  /// in pending_ for the next receive (once destroyed, it is refused). Takes mu_.
  void take(const message& m) noexcept;
  /// Tells the exporter that allocation `id` will never be imported here: its claim goes.
  /// With `may_block` false, a refusal that would wait (a full socket, another thread sending)
  /// is not sent, and the claim stays until this process exits.
  void refuse(uint64_t id, bool may_block) noexcept;
  /// Reads what the exporter sent that has arrived whole, without blocking, unless a receive is
  /// reading: its acknowledgements must not pile up unread while no receive runs, or the
  /// exporter, then the importer's own releases, would block on full sockets.
  void drain() noexcept;
  /// The last reference went: closes the connection and tears down.
  void unref() noexcept;

  allocator_reference allocator_;  ///< first: released after every other member
  driver& drv_;
  channel channel_;
  ipc_event_pool events_;
  imported_pool pool_ = nullptr;
  stream_handle free_stream_ = nullptr;  ///< the imports' frees, and the events after them
  /// Held by the one thread reading the socket (a receive, or a drain).
  std::mutex reading_mu_;
  std::mutex mu_;
  std::unordered_map<uint64_t, ipc_event_pool::entry> release_events_;  ///< by import id
  std::deque<message> pending_;  ///< allocations a drain read, for the next receives
  bool exporter_gone_ = false;
  bool destroyed_ = false;  ///< the user's handle went: no receive will take an allocation
  std::atomic<int> refs_{1};
};

}  // namespace arcpool::detail::ipc
