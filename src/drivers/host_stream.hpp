// Host-driver streams: a worker thread per stream running queued host work in order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "drivers/driver.hpp"

namespace arcpool::detail {

/// True on a host stream's worker while it runs queued work (where driver calls are refused,
/// as CUDA refuses them in host callbacks).
bool in_host_work() noexcept;

/// One in-order queue of host work and the thread that runs it.
class host_stream {
 public:
  explicit host_stream(uint64_t id);
  /// Closes the stream and joins its worker after the queue drained. Never call it from the
  /// stream's own worker.
  ~host_stream();
  host_stream(const host_stream&) = delete;
  host_stream& operator=(const host_stream&) = delete;

  /// Process-unique identity.
  uint64_t id() const noexcept { return id_; }

  /// Appends `task` to the queue. On a closed stream the task runs inline, so nothing queued
  /// after process teardown is lost.
  void enqueue(std::function<void()> task);

  /// Blocks until every task enqueued before this call has run.
  void synchronize();

  /// Accepts no more tasks; the worker exits once the queue is empty.
  void close();

  /// Closes the stream and waits for its worker to exit (never from the worker itself).
  void join();

  /// Whether the worker ran everything and left its loop: closed, nothing left to run.
  bool drained() {
    std::lock_guard<std::mutex> lock(mutex_);
    return drained_;
  }

  /// Tasks enqueued so far (tests prove arcpool never touched a stream with it).
  uint64_t enqueued() {
    std::lock_guard<std::mutex> lock(mutex_);
    return enqueued_;
  }

  /// Blocks until the stream is idle (every task enqueued so far has run) or its worker is
  /// blocked in a wait that cannot end without the test: a closed test latch, or an event wait
  /// whose recording stream has itself settled without completing the event (see
  /// host_work_blocking). A wait that is merely slow, or a latch already opened, is waited out.
  /// Tests use it to prove that a stream cannot reach a point, deterministically.
  void settle();

  /// Simulated graph capture.
  std::atomic<bool> capturing{false};

 private:
  void run();

  const uint64_t id_;
  std::mutex mutex_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  bool closing_ = false;
  bool drained_ = false;  ///< the worker left its loop
  bool blocked_ = false;
  uint64_t block_epoch_ = 0;               ///< counts blocking scopes entered
  std::weak_ptr<host_stream> blocked_on_;  ///< the stream that must progress (none: the test)
  std::function<bool()> unblocked_;        ///< whether the wait can end now

  friend class host_work_blocking;
  std::thread worker_;
};

/// Marks the calling host work as blocked on something another stream or the test must
/// provide for the scope of the object. Outside host work it does nothing.
class host_work_blocking {
 public:
  /// Blocked on the test, with no way to tell when it ends.
  host_work_blocking();
  /// Blocked until `unblocked()` holds, which work queued on `on` brings about (an event
  /// wait: the stream the event was recorded on), or the test when `on` is empty (a latch).
  /// `unblocked` is called from other threads and must not call into any stream.
  host_work_blocking(std::weak_ptr<host_stream> on, std::function<bool()> unblocked);
  ~host_work_blocking();
  host_work_blocking(const host_work_blocking&) = delete;
  host_work_blocking& operator=(const host_work_blocking&) = delete;

 private:
  host_stream* stream_;
};

/// Resolves a stream handle to its host stream: NULL and cudaStreamLegacy name the process's
/// legacy default stream, cudaStreamPerThread the calling thread's own stream, anything else a
/// stream made by host_stream_create. Returns null for an unknown or destroyed handle.
std::shared_ptr<host_stream> host_stream_find(stream_handle s);

/// Creates a host stream and returns its handle.
stream_handle host_stream_create();

/// Closes and forgets the stream; queued work still runs. False for an unknown handle.
bool host_stream_destroy(stream_handle s);

/// Blocks until every host stream of the process has run everything queued so far: every
/// thread's per-thread default stream and destroyed streams still draining included, as
/// cudaDeviceSynchronize waits for all work on the device.
void host_synchronize_all();

}  // namespace arcpool::detail
