// design.md §3: indeterminate lifetimes, imports (borrow and consume) with on_free, export and
// views, on both drivers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 64 << 10;

/// Counts on_free calls and remembers the last arguments.
struct on_free_log {
  std::atomic<int> calls{0};
  void* pointer = nullptr;
  size_t size = 0;

  static void record(void* p, size_t n, void* user_data) {
    auto* log = static_cast<on_free_log*>(user_data);
    log->pointer = p;
    log->size = n;
    log->calls.fetch_add(1);
  }
};

class Lifetime : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = make_stream();
    user_ = make_stream();
  }

  /// Foreign memory to import: from the pool itself, so that both drivers can use it.
  void* foreign(size_t bytes) {
    void* p = nullptr;
    EXPECT_OK(core().drv().pool_allocate(bytes, s_, &p));
    foreign_.push_back({p, bytes});
    return p;
  }

  void TearDown() override {
    if (alloc_ != nullptr) {
      for (auto& [p, n] : foreign_)
        EXPECT_OK(core().drv().pool_free(p, n, s_));
    }
    DriverTest::TearDown();
  }

  /// Posts `task` where no reclaim worker takes it first and starts `poller` running it;
  /// returns whether it started within 10 s.
  template <class Task>
  bool post_and_start(Task* task, std::thread& poller) {
    std::future<void> started = task->started.get_future();
    core().prepare_posted_task();
    core().await_posted_task();
    core().post_task(task);
    EXPECT_EQ(1u, core().reclaim_pending()) << "posted, not yet run";
    poller = std::thread([this] { core().reclaim_poll_once(); });
    const bool ran = started.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    EXPECT_TRUE(ran) << "no thread ran the posted task";
    return ran;
  }

  /// Expects the reclaimer to have nothing pending within 10 s.
  void expect_nothing_pending_soon() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (core().reclaim_pending() != 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::yield();
    EXPECT_EQ(0u, core().reclaim_pending());
  }

  arcpool_stream_t s_ = nullptr;
  arcpool_stream_t user_ = nullptr;
  std::vector<std::pair<void*, size_t>> foreign_;
};

// --- Indeterminate lifetime ----------------------------------------------------------------

TEST_P(Lifetime, IndeterminateDeallocationEnqueuesNothing) {
  arcpool_allocation_t* a = allocate(kBytes, s_, ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
  EXPECT_TRUE(placement(a).flags & ARCPOOL_PLACEMENT_FLAG_INDETERMINATE_LIFETIME);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  EXPECT_EQ(ARCPOOL_ALLOCATION_DEALLOCATED, info(a).state);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_deallocate_async(a, s_, 0));
  sync(s_);
  EXPECT_EQ(1u, stats().ignored_deallocations);
  EXPECT_EQ(0u, stats().frees);
  EXPECT_EQ(0u, core().reclaim_pending()) << "nothing is queued while a reference remains";
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  arcpool_allocation_release(a);  // the last reference: now the memory goes back
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
  if (on_host()) {
    EXPECT_LT(pool_used(), used);
  }
}

TEST_P(Lifetime, IndeterminateMemoryWaitsForEveryFenceAfterTheLastReference) {
  arcpool_allocation_t* a = allocate(kBytes, s_, ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
  sync(s_);  // a use on another stream must be ordered after the allocation
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_record_use(a, user_));
  gate& busy = block(user_);
  fill_async(user_, data(a), kBytes, 0x12);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
  run_unheld({s_});
  expect_pending(1, kBytes, 0);  // freed while a recorded user still writes, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used()) << "the pool got the block back while the user writes";
  }
  busy.open();
  sync(user_);
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
}

TEST_P(Lifetime, AViewKeepsIndeterminateMemoryAlive) {
  arcpool_allocation_t* a = allocate(kBytes, s_, ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
  arcpool_allocation_t* v = nullptr;
  EXPECT_OK(arcpool_allocation_view(a, 0, 16, &v));
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
  sync(s_);
  EXPECT_EQ(0u, core().reclaim_pending());
  EXPECT_EQ(0u, stats().frees);
  arcpool_allocation_release(v);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
}

TEST_P(Lifetime, LeakedIndeterminateAllocationGoesBackAfterItsUses) {
  arcpool_allocation_t* a = allocate(kBytes, s_, ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
  const uint64_t used = pool_used();
  gate& busy = block(s_);
  fill_async(s_, data(a), kBytes, 0x13);
  arcpool_allocation_release(a);  // never deallocated
  EXPECT_EQ(1u, stats().implicit_frees);
  run_unheld({user_});  // only s_ is held; nothing else may free it
  expect_pending(1, kBytes, 0);
  if (on_host()) {
    EXPECT_EQ(used, pool_used()) << "the pool got the block back while s_ writes";
  }
  busy.open();
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
}

// --- Imports -------------------------------------------------------------------------------

TEST_P(Lifetime, ABorrowedImportReportsOnceWhenArcpoolsUsesCompleted) {
  on_free_log log;
  void* p = foreign(kBytes);
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc_, p, kBytes, s_, 0, &on_free_log::record, &log, &a));
  EXPECT_TRUE(placement(a).flags & ARCPOOL_PLACEMENT_FLAG_EXTERNAL);
  EXPECT_EQ(p, data(a));
  EXPECT_OK(arcpool_record_use(a, user_));
  gate& busy = block(user_);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  run_unheld({s_});
  expect_pending(1, 0, 0);  // imported bytes are never pending pool bytes
  EXPECT_EQ(0, log.calls.load()) << "on_free before the recorded user finished";
  busy.open();
  sync(user_);
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1, log.calls.load());
  EXPECT_EQ(p, log.pointer);
  EXPECT_EQ(kBytes, log.size);
  arcpool_allocation_release(a);
  EXPECT_EQ(1, log.calls.load()) << "exactly once";
  const auto st = stats();
  EXPECT_EQ(1u, st.imports);
  EXPECT_EQ(0u, st.frees) << "arcpool never frees imported memory";
  EXPECT_EQ(0u, st.bytes_in_use_peak) << "imported bytes are not arcpool's";
}

TEST_P(Lifetime, AFailedConsumingImportFreesTheForeignMemoryOnce) {
  on_free_log log;
  void* p = foreign(kBytes);
  arcpool_allocation_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_import(alloc_, p, kBytes, s_, ARCPOOL_IMPORT_FLAG_CONSUME | (1u << 9),
                               &on_free_log::record, &log, &a));
  EXPECT_EQ(1, log.calls.load());
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_import(alloc_, p, kBytes, s_, ARCPOOL_IMPORT_FLAG_CONSUME,
                               &on_free_log::record, &log, nullptr));
  EXPECT_EQ(2, log.calls.load());
  EXPECT_EQ(nullptr, a);
}

TEST_P(Lifetime, AFailedBorrowingImportCallsNothing) {
  on_free_log log;
  arcpool_allocation_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_import(alloc_, nullptr, kBytes, s_, 0, &on_free_log::record, &log, &a));
  EXPECT_EQ(0, log.calls.load());
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_import(alloc_, foreign(16), 16, s_, ARCPOOL_IMPORT_FLAG_CONSUME, nullptr,
                               nullptr, &a))
      << "a consuming import needs on_free";
}

TEST_P(Lifetime, AConsumingImportIsFreedThroughOnFreeWhenItsOwnerGoes) {
  on_free_log log;
  void* p = foreign(kBytes);
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc_, p, kBytes, s_, ARCPOOL_IMPORT_FLAG_CONSUME, &on_free_log::record,
                           &log, &a));
  EXPECT_OK(arcpool_allocation_discard_and_release(a));  // the one claim was the last
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1, log.calls.load());
}

TEST_P(Lifetime, AConsumingImportOfZeroBytesStillCallsOnFreeOnce) {
  on_free_log log;
  int empty_tensor_storage = 0;  // a framework's empty tensor may carry a non-null pointer
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc_, &empty_tensor_storage, 0, s_, ARCPOOL_IMPORT_FLAG_CONSUME,
                           &on_free_log::record, &log, &a));
  EXPECT_OK(arcpool_allocation_discard_and_release(a));
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1, log.calls.load()) << "a consuming import's on_free is the foreign free itself";
  EXPECT_EQ(&empty_tensor_storage, log.pointer);
  EXPECT_EQ(0u, log.size);
}

struct reentry {
  arcpool_allocator_t* allocator;
  arcpool_stream_t stream;
  std::atomic<int> calls{0};
  std::atomic<int> failures{0};
};

TEST_P(Lifetime, OnFreeMayCallArcpool) {
  reentry r{alloc_, s_};
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(
      alloc_, foreign(kBytes), kBytes, s_, 0,
      [](void*, size_t, void* user_data) {
        auto* re = static_cast<reentry*>(user_data);
        arcpool_allocation_t* b = nullptr;
        if (arcpool_allocate_async(re->allocator, 128, 0, re->stream, 0, &b) !=
                ARCPOOL_STATUS_SUCCESS ||
            arcpool_deallocate_async(b, re->stream, 0) != ARCPOOL_STATUS_SUCCESS) {
          re->failures.fetch_add(1);
        }
        arcpool_allocation_release(b);
        re->calls.fetch_add(1);
      },
      &r, &a));
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1, r.calls.load());
  EXPECT_EQ(0, r.failures.load());
  arcpool_allocation_release(a);
}

TEST_P(Lifetime, AThrowingOnFreeRunsOnceAndTheWorkerSurvives) {
  static std::atomic<int> calls{0};
  calls = 0;
  auto throwing = [](void*, size_t, void*) {
    calls.fetch_add(1);
    throw std::runtime_error("on_free failed");
  };
  for (int i = 0; i < 2; ++i) {
    arcpool_allocation_t* a = nullptr;
    ASSERT_OK(arcpool_import(alloc_, foreign(64), 64, s_, 0, throwing, nullptr, &a));
    EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
    sync(s_);
    finish_reclaims();
    EXPECT_EQ(i + 1, calls.load());
  }
}

/// An on_free callback that waits for the test, then says where it ran.
struct held_callback {
  detail::reclaimer* reclaims = nullptr;
  std::promise<void> entered;
  std::promise<void> go_on;
  std::shared_future<void> go_on_future = go_on.get_future().share();
  std::atomic<bool> on_worker{false};
  std::atomic<bool> returned{false};

  static void run(void*, size_t, void* user_data) {
    auto* h = static_cast<held_callback*>(user_data);
    h->entered.set_value();
    h->go_on_future.wait();
    h->on_worker = h->reclaims->on_worker_thread();
    h->returned = true;
  }
};

// At exit, the exit hook's listener joins the reclaim worker while an on_free callback on it may
// drop the allocator's last handle, so that the janitor deletes the allocator: both stop the
// worker. The second must wait for the first one's join (it found no worker to join, returned,
// and the allocator was deleted under the running worker), and the worker must still know itself
// (else the allocator is deleted on it).
TEST_P(Lifetime, AWorkerBeingJoinedByOneThreadIsWaitedForByAnotherThatStopsIt) {
  ARCPOOL_SKIP_ON_DETERMINISTIC("no reclaim worker runs there");
  held_callback held;
  held.reclaims = &core().reclaims();
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc_, foreign(kBytes), kBytes, s_, 0, &held_callback::run, &held, &a));
  gate& g = block(s_);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));  // deferred: s_ waits for the gate
  arcpool_allocation_release(a);
  g.open();
  ASSERT_EQ(std::future_status::ready, held.entered.get_future().wait_for(std::chrono::seconds(10)))
      << "the worker never ran the callback";
  std::thread joiner([&] { held.reclaims->stop_worker(false); });  // as the exit hook does
  // Give the joiner the worker first (if this thread takes it instead, it joins it itself and
  // the test still holds).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::atomic<bool> stopped{false};
  std::atomic<bool> callback_had_returned{false};
  std::thread second([&] {  // as the janitor's delete does
    held.reclaims->stop_worker(false);
    callback_had_returned = held.returned.load();
    stopped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(stopped.load()) << "a stop returned while the worker still ran a callback";
  held.go_on.set_value();
  joiner.join();
  second.join();
  EXPECT_TRUE(callback_had_returned.load());
  EXPECT_TRUE(held.on_worker.load())
      << "the worker, taken to be joined, no longer knew itself: an on_free callback that drops "
         "the last handle there would delete the allocator on its own worker";
}

/// A posted task that waits, once running, until the test lets it go on.
struct held_task : detail::posted_task {
  held_task() { run = &hold; }
  std::promise<void> started;
  std::promise<void> go_on;
  std::shared_future<void> go_on_future = go_on.get_future().share();
  std::atomic<bool> finished{false};

  static void hold(detail::posted_task* t) noexcept {
    auto* task = static_cast<held_task*>(t);
    task->started.set_value();
    task->go_on_future.wait();
    task->finished = true;
  }
};

// A graph's user object hands its deferred free to the reclaim worker as a posted task, which
// enqueues the free when it runs. While it runs, the free is in neither the inbox nor the queue:
// counted by neither, a caller waiting for pending() to reach 0 stopped before the free (CI's
// simcuda run, GraphCapture.AUserObjectsDestructorNeverWaitsForTheReclaimWorker).
TEST_P(Lifetime, APostedTaskIsPendingUntilItHasRun) {
  auto* task = new held_task;
  std::thread poller;
  const bool ran = post_and_start(task, poller);
  if (ran) {
    EXPECT_EQ(1u, core().reclaim_pending()) << "running, not yet run to its end";
  }
  task->go_on.set_value();
  poller.join();
  if (!ran) return;  // the task stays in the inbox: leaked, not freed under the reclaimer
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!task->finished.load() && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  ASSERT_TRUE(task->finished.load());
  expect_nothing_pending_soon();
  delete task;
}

// A drain completes everything now (trim, the out-of-memory retry): also what a posted task
// running meanwhile enqueues. It waited only for the items being completed, so a task the worker
// had taken, not yet run to its end, was left out, and its frees came after the drain returned.
TEST_P(Lifetime, ADrainWaitsForAPostedTaskRunningNow) {
  auto* task = new held_task;
  std::thread poller;
  const bool ran = post_and_start(task, poller);
  std::atomic<bool> drained{false};
  bool task_ended_before_the_drain = false;
  std::thread drainer([&] {
    EXPECT_OK(core().reclaim_drain());
    task_ended_before_the_drain = task->finished.load();
    drained = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(drained.load()) << "the drain returned while a posted task ran";
  task->go_on.set_value();
  drainer.join();
  poller.join();
  EXPECT_TRUE(task_ended_before_the_drain);
  if (!ran) return;  // the task stays in the inbox: leaked, not freed under the reclaimer
  expect_nothing_pending_soon();
  delete task;
}

TEST_P(Lifetime, AnIndeterminateImportReportsAfterTheLastReference) {
  on_free_log log;
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc_, foreign(kBytes), kBytes, s_,
                           ARCPOOL_IMPORT_FLAG_INDETERMINATE_LIFETIME, &on_free_log::record, &log,
                           &a));
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  sync(s_);
  EXPECT_EQ(0u, core().reclaim_pending());
  EXPECT_EQ(0, log.calls.load());
  arcpool_allocation_release(a);
  finish_reclaims();
  EXPECT_EQ(1, log.calls.load());
}

// --- Export --------------------------------------------------------------------------------

TEST_P(Lifetime, ExportFencesEveryUseOntoTheCurrentStream) {
  arcpool_allocation_t* a = allocate(kBytes, s_);
  EXPECT_OK(arcpool_record_use(a, user_));
  gate& busy = block(user_);
  void* p = nullptr;
  EXPECT_OK(arcpool_allocation_export(a, &p));
  auto after = mark(s_);
  settle(s_);
  EXPECT_FALSE(after->reached()) << "the current stream must wait on the recorded use";
  busy.open();
  sync(s_);
  EXPECT_TRUE(after->reached());
  const auto st = stats();
  EXPECT_EQ(1u, st.exports);
  EXPECT_EQ(0u, st.bytes_in_use_current);
  EXPECT_EQ(0u, st.bytes_held_current);
  arcpool_allocation_release(a);
  free_exported(p, kBytes, s_);
}

TEST_P(Lifetime, ExportOfAnOverAlignedAllocationIsUnsupported) {
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, 4096, s_, 0, &a));
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(data(a)) % 4096);
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_allocation_export(a, &p));
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(a).state);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(Lifetime, ExportOfAnImportIsUnsupportedAndItsOnFreeStillRunsOnce) {
  on_free_log log;
  void* p = foreign(kBytes);
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc_, p, kBytes, s_, ARCPOOL_IMPORT_FLAG_CONSUME, &on_free_log::record,
                           &log, &a));
  void* out = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_allocation_export(a, &out));
  EXPECT_NE(std::string::npos, std::string(arcpool_last_error()).find("imported memory"))
      << arcpool_last_error();
  EXPECT_EQ(nullptr, out);
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(a).state);
  EXPECT_OK(arcpool_allocation_discard_and_release(a));
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(1, log.calls.load()) << "an import's on_free runs exactly once";
  EXPECT_EQ(0u, stats().exports);
}

// --- Views ---------------------------------------------------------------------------------

TEST_P(Lifetime, EveryOwnershipCallOnAViewActsOnItsAllocation) {
  arcpool_allocation_t* a = allocate(kBytes, s_);
  arcpool_allocation_t* v = nullptr;
  ASSERT_OK(arcpool_allocation_view(a, 1024, 4096, &v));
  EXPECT_EQ(static_cast<char*>(data(a)) + 1024, data(v));
  EXPECT_EQ(4096u, arcpool_allocation_size(v));
  EXPECT_EQ(1, arcpool_allocation_is_terminal(v));
  EXPECT_OK(arcpool_allocation_preserve(v));
  EXPECT_EQ(2u, info(a).owners);
  EXPECT_EQ(0, arcpool_allocation_is_terminal(a));
  EXPECT_OK(arcpool_allocation_discard(v, nullptr));
  EXPECT_EQ(2u, info(a).references) << "the view holds a reference, not a claim";
  EXPECT_EQ(kBytes, placement(v).size) << "the placement is the allocation's";
  EXPECT_OK(arcpool_transfer(v, user_));
  EXPECT_EQ(user_, info(a).current_stream);
  EXPECT_OK(arcpool_deallocate_async(v, user_, 0));
  EXPECT_EQ(ARCPOOL_ALLOCATION_DEALLOCATED, info(a).state);
  void* gone = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_data(v, &gone));
  arcpool_allocation_release(a);
  EXPECT_EQ(1u, info(v).references) << "the view keeps the record readable";
  arcpool_allocation_release(v);
}

TEST_P(Lifetime, ViewsOfViewsComposeAndCheckBounds) {
  arcpool_allocation_t* a = allocate(kBytes, s_);
  arcpool_allocation_t* v = nullptr;
  arcpool_allocation_t* w = nullptr;
  ASSERT_OK(arcpool_allocation_view(a, 4096, 8192, &v));
  ASSERT_OK(arcpool_allocation_view(v, 256, 512, &w));
  EXPECT_EQ(static_cast<char*>(data(a)) + 4096 + 256, data(w));
  arcpool_allocation_t* bad = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_view(v, 8000, 256, &bad));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_view(a, 1, SIZE_MAX, &bad));
  EXPECT_EQ(nullptr, bad);
  EXPECT_OK(arcpool_allocation_view(a, kBytes, 0, &bad)) << "an empty view at the end is fine";
  arcpool_allocation_release(bad);
  EXPECT_EQ(3u, info(a).references);
  arcpool_allocation_release(w);
  arcpool_allocation_release(v);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(Lifetime, ZeroBytesIsAValidAllocationWithANullPointer) {
  arcpool_allocation_t* a = allocate(0, s_);
  EXPECT_EQ(nullptr, data(a));
  EXPECT_EQ(0u, arcpool_allocation_size(a));
  EXPECT_EQ(1, arcpool_allocation_is_terminal(a));
  EXPECT_OK(arcpool_deallocate_async(a, user_, 0));
  EXPECT_EQ(ARCPOOL_ALLOCATION_DEALLOCATED, info(a).state);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
  sync(s_);
  EXPECT_EQ(0u, stats().frees);
  EXPECT_EQ(0u, stats().fences_taken);
  EXPECT_EQ(0u, core().reclaim_pending());
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(Lifetime);

}  // namespace
}  // namespace arcpool::test
