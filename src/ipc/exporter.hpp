// The exporting end of an IPC connection (arcpool_ipc_exporter_t, design.md §14).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "arcpool/ipc.h"
#include "ipc/allocator_reference.hpp"
#include "ipc/channel.hpp"
#include "ipc/event_pool.hpp"

namespace arcpool::detail {
class allocation;
}  // namespace arcpool::detail

namespace arcpool::detail::ipc {

/// Shares one allocator's owned pool with one importing process, and holds a claim on each
/// allocation sent until the importer released it or exited. A thread watches the socket.
class exporter {
 public:
  /// Sends the pool, reads the importer's greeting and starts the watching thread.
  static arcpool_status_t create(arcpool_allocator_t* allocator, int fd, exporter** out);

  /// arcpool_ipc_send.
  arcpool_status_t send(arcpool_allocation_t* a);
  /// Allocations sent and not yet released.
  size_t outstanding();
  /// The user's handle goes: a goodbye to the importer, then the watcher ends the rest.
  void destroy() noexcept;

 private:
  /// One allocation sent: the exporter's claim and reference, and the event sent with it.
  struct sent {
    arcpool_allocation_t* allocation = nullptr;
    ipc_event_pool::entry event;
  };

  exporter(arcpool_allocator_t* allocator, int fd, arcpool_stream_t watch_stream,
           arcpool_stream_t send_stream);

  /// Whether `record` was sent and not yet released (or refused). With mu_.
  bool already_sent_locked(const allocation& record) const;
  ~exporter();

  /// The watching thread: releases as the importer reports them, then everything left once
  /// the importer is gone.
  void watch() noexcept;
  /// Import `id` was freed by the importer after `importer_event`: the claim's drop waits on
  /// that event. False (claim kept) when the wait cannot be enqueued.
  bool release_after(uint64_t id, const ipc_event_data& importer_event) noexcept;
  /// The importer could not import `id`: its claim goes now, with no wait.
  void refused(uint64_t id) noexcept;
  /// Blocks until the importing process has exited (its pidfd, or without one a poll every
  /// kExitPoll), when it holds imports.
  void wait_for_importer_exit() noexcept;
  /// Whether process `pid` exists and has not terminated (a zombie has).
  static bool process_running(pid_t pid) noexcept;
  /// Drops the claim and reference of `s` (the last claim deallocates).
  void drop(const sent& s) noexcept;
  void unref() noexcept;

  allocator_reference allocator_;  ///< first: released after every other member
  driver& drv_;
  channel channel_;
  ipc_event_pool events_;
  const arcpool_stream_t watch_stream_;  ///< waits on importers' events; created on allocator_
  /// Joins the streams of an allocation sent with use records before its event is recorded
  /// (apart from watch_stream_, whose waits on importers' releases sends must not wait for).
  const arcpool_stream_t send_stream_;
  pid_t importer_pid_ = 0;  ///< the importing process, as the kernel named it (SCM_CREDENTIALS)
  std::mutex mu_;
  std::unordered_map<uint64_t, sent> sent_;
  uint64_t next_id_ = 1;
  bool destroyed_ = false;
  std::atomic<int> refs_{2};  ///< the user's handle, the watching thread and each send running

  /// How often an importer without a pidfd is looked at, once it hung up holding imports.
  static constexpr std::chrono::milliseconds kExitPoll{10};
};

}  // namespace arcpool::detail::ipc
