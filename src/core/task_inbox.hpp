// The reclaim worker's inbox: work that threads which must not block (CUDA's user-object
// destructors) hand to the worker, and the idle wait that cannot sleep through it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace arcpool::detail {

/// Work that a thread which must not block hands to the reclaim worker: a user object's
/// destructor, of which cudaUserObjectCreate says "Destructor callbacks cannot make CUDA API
/// calls and should avoid blocking behavior, as they are executed by a shared internal thread.
/// Another thread may be signaled to perform such actions". Intrusive, so that posting
/// allocates nothing.
struct posted_task {
  /// The work, run once on the worker (or a thread that polls or drains), with no lock held.
  void (*run)(posted_task*) noexcept = nullptr;
  posted_task* next = nullptr;  ///< the inbox's link
};

/// The posted tasks of one worker, pushed without a lock and taken all at once. The worker's
/// mutex and condition variable stay the worker's: the inbox only notifies them, and waits on
/// them in wait_idle.
///
/// A post notifies without the mutex (its thread may not block), so its notification can fall
/// between an idle worker's look at the inbox and its wait. Posts are therefore announced
/// first, by a thread that may block (the one arming the user object): the announcement passes
/// through the worker's mutex, and while posts are announced the idle worker looks at the inbox
/// every kRecheck.
class task_inbox {
 public:
  /// How often an idle worker looks at the inbox while a post is announced and not yet made.
  static constexpr std::chrono::milliseconds kRecheck{50};

  /// Announces a post to come. Takes `mutex` (the worker's) once after counting it: a worker
  /// that looked at the count before is waiting on `work` by then, and is woken to look again.
  void expect(std::mutex& mutex, std::condition_variable& work) noexcept {
    expected_.fetch_add(1, std::memory_order_acq_rel);
    { std::lock_guard<std::mutex> passed_through(mutex); }
    work.notify_all();
  }

  /// Hands `task` (announced by expect) to the worker without blocking: no lock, no allocation,
  /// a lock-free push and a notification of `work`.
  void post(posted_task* task, std::condition_variable& work) noexcept {
    unfinished_.fetch_add(1, std::memory_order_relaxed);
    posted_task* head = posted_.load(std::memory_order_relaxed);
    do {
      task->next = head;
    } while (!posted_.compare_exchange_weak(head, task, std::memory_order_release,
                                            std::memory_order_relaxed));
    // After the push: a worker that reads the count this leaves sees the task (release/acquire).
    expected_.fetch_sub(1, std::memory_order_acq_rel);
    work.notify_one();
  }

  /// Takes every posted task, oldest first, linked through `next` (null: none). The taker runs
  /// each, then calls finished() once per task.
  posted_task* take() noexcept {
    posted_task* task = posted_.exchange(nullptr, std::memory_order_acquire);
    posted_task* oldest_first = nullptr;
    while (task != nullptr) {
      posted_task* next = task->next;
      task->next = oldest_first;
      oldest_first = task;
      task = next;
    }
    return oldest_first;
  }
  /// One task from take() ran to its end.
  void finished() noexcept { unfinished_.fetch_sub(1, std::memory_order_release); }

  /// Whether a task is posted and not yet taken.
  bool has_tasks() const noexcept { return posted_.load(std::memory_order_acquire) != nullptr; }
  /// Posts made and not yet run to their end.
  size_t unfinished() const noexcept { return unfinished_.load(std::memory_order_acquire); }
  /// Whether a post is announced and not made, or made and not run to its end.
  bool outstanding() const noexcept {
    // The announced count first: post() counts the task unfinished before it drops it.
    return expected_.load(std::memory_order_acquire) > 0 || unfinished() > 0;
  }

  /// The idle worker's wait: `lock` holds the worker's mutex, `work` is its condition variable.
  /// Returns once `ready()` (read under the lock) or a task is posted; while posts are announced,
  /// after kRecheck at most; and when a post is announced. `after_look(result)` runs after each
  /// look, the lock held (a test's seam; nothing otherwise).
  template <class Ready, class AfterLook>
  void wait_idle(std::unique_lock<std::mutex>& lock, std::condition_variable& work, Ready&& ready,
                 AfterLook&& after_look) {
    auto look = [&](bool announced_wakes) {
      const bool woken = ready() || has_tasks() ||
                         (announced_wakes && expected_.load(std::memory_order_acquire) > 0);
      after_look(woken);
      return woken;
    };
    if (expected_.load(std::memory_order_acquire) > 0) {
      work.wait_for(lock, kRecheck, [&] { return look(false); });
    } else {
      work.wait(lock, [&] { return look(true); });
    }
  }
  template <class Ready>
  void wait_idle(std::unique_lock<std::mutex>& lock, std::condition_variable& work, Ready&& ready) {
    wait_idle(lock, work, ready, [](bool) {});
  }

 private:
  std::atomic<posted_task*> posted_{nullptr};  ///< newest first
  std::atomic<int64_t> expected_{0};           ///< posts announced and not yet made
  std::atomic<size_t> unfinished_{0};          ///< posts made and not yet run to their end
};

}  // namespace arcpool::detail
