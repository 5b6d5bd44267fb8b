// design.md §6: a stream that was alive when an allocation named it and was retired since
// (registered then unregistered, or created then destroyed) is never enqueued on again:
// prefer-origin falls back, the reclaimer frees elsewhere, a retired current stream's implicit
// free goes through the reclaim path, and its final fence stands for its work. A registry
// entry alone is no proof of liveness (issue 9).
//
// "Never enqueued on" is counted where the driver can count (the host drivers: every task
// queued on the stream, fences, waits and frees included); on every driver the frees are
// checked by the stream they were enqueued on, and a call on a destroyed stream fails.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/driver_test.hpp"
#include "support/simcuda_probe.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 64 << 10;

class RetiredStreams : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    origin_ = make_stream();
    current_ = make_stream();
    caller_ = make_stream();
  }

  /// An application stream registered with the allocator.
  arcpool_stream_t registered() {
    arcpool_stream_t s = make_app_stream();
    EXPECT_OK(arcpool_stream_register(alloc_, s));
    return s;
  }

  /// Expects no work queued on `s` since `before` was read (where the driver can count it).
  void expect_untouched(arcpool_stream_t s, uint64_t before, const char* what) {
    if (can_count_work()) {
      EXPECT_EQ(before, work_enqueued(s)) << what << " enqueued on " << s;
    }
  }

  arcpool_stream_t origin_ = nullptr;
  arcpool_stream_t current_ = nullptr;
  arcpool_stream_t caller_ = nullptr;
};

TEST_P(RetiredStreams, PreferOriginNeverEnqueuesOnAnOriginUnregisteredSinceTheAllocation) {
  arcpool_stream_t app = registered();
  arcpool_allocation_t* a = allocate(kBytes, app);  // alive at the allocation
  void* const mem = data(a);
  EXPECT_OK(arcpool_transfer(a, current_));
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  const uint64_t before = work_enqueued(app);
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  expect_untouched(app, before, "prefer-origin");
  EXPECT_EQ(std::vector<arcpool_stream_t>{caller_}, streams_that_freed(mem)) << "falls back";
  EXPECT_EQ(1u, stats().origin_fallbacks);
  EXPECT_EQ(0u, stats().origin_routed_frees);
  sync(caller_);
  expect_untouched(app, before, "prefer-origin");
  arcpool_allocation_release(a);
}

TEST_P(RetiredStreams, PreferOriginNeverEnqueuesOnAnOriginDestroyedSinceTheAllocation) {
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
  arcpool_allocation_t* a = allocate(kBytes, doomed);
  void* const mem = data(a);
  EXPECT_OK(arcpool_transfer(a, current_));
  ASSERT_OK(arcpool_stream_destroy(alloc_, doomed));
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN))
      << "a call on the destroyed origin would fail";
  EXPECT_EQ(std::vector<arcpool_stream_t>{caller_}, streams_that_freed(mem)) << "falls back";
  EXPECT_EQ(1u, stats().origin_fallbacks);
  EXPECT_EQ(0u, stats().origin_routed_frees);
  sync(caller_);
  EXPECT_EQ(0u, stats().reclaim_failures);
  arcpool_allocation_release(a);
}

TEST_P(RetiredStreams, TheReclaimerNeverFreesOnAnOriginUnregisteredSinceTheAllocation) {
  arcpool_stream_t app = registered();
  arcpool_allocation_t* a = allocate(kBytes, app);
  void* const mem = data(a);
  EXPECT_OK(arcpool_transfer(a, current_));
  gate& busy = block(current_);  // keeps the deferred free pending until app is retired
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));  // after the deallocation, before the free
  const uint64_t before = work_enqueued(app);
  run_unheld({caller_, origin_});
  expect_pending(1, kBytes, 0);
  busy.open();
  sync(caller_);
  sync(current_);
  finish_reclaims();
  expect_untouched(app, before, "the reclaimer");
  const std::vector<arcpool_stream_t> freed = streams_that_freed(mem);
  ASSERT_EQ(1u, freed.size());
  EXPECT_NE(app, freed[0]);
  EXPECT_EQ(1u, stats().origin_fallbacks);
  arcpool_allocation_release(a);
}

/// A fallback is a free made elsewhere (design.md §3, prefer-origin): when the reclaimer's free
/// on its own stream fails, the memory is written off (a reclaim failure), not counted as a
/// fallback.
TEST_P(RetiredStreams, TheReclaimersFailedFallbackFreeIsNotCountedAsAFallback) {
  if (GetParam().kind != ARCPOOL_DRIVER_CUDA || !on_simcuda()) {
    GTEST_SKIP() << "fails the reclaimer's free with simcuda_fail_next";
  }
  arcpool_stream_t app = registered();
  arcpool_allocation_t* a = allocate(kBytes, app);
  EXPECT_OK(arcpool_transfer(a, current_));
  gate& busy = block(current_);  // keeps the deferred free pending until app is retired
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  run_unheld({caller_, origin_});
  expect_pending(1, kBytes, 0);
  ASSERT_TRUE(simcuda_fail_next("cudaFreeAsync", cudaErrorInvalidValue));  // the next free
  busy.open();
  sync(caller_);
  sync(current_);
  finish_reclaims();
  const arcpool_stats_t st = stats();
  EXPECT_EQ(1u, st.reclaim_failures);
  EXPECT_EQ(0u, st.frees);
  EXPECT_EQ(0u, st.origin_fallbacks) << "a free that failed counted as a fallback";
  arcpool_allocation_release(a);
}

/// The sharpest case: the retired stream is origin and current, so that without the liveness
/// check the implicit free would be a same-stream free on it.
TEST_P(RetiredStreams, AnUnregisteredCurrentStreamsImplicitFreeGoesThroughTheReclaimPath) {
  arcpool_stream_t app = registered();
  arcpool_allocation_t* a = allocate(kBytes, app);
  void* const mem = data(a);
  gate& busy = block(app);
  fill_async(app, mem, kBytes, 0x31);
  const uint64_t used = pool_used();
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));  // its final fence covers the fill
  const uint64_t before = work_enqueued(app);
  arcpool_allocation_release(a);  // a leaked owner: the implicit free
  expect_untouched(app, before, "the implicit free");
  const arcpool_stats_t st = stats();
  EXPECT_EQ(1u, st.implicit_frees);
  EXPECT_EQ(1u, st.deferred_frees) << "through the reclaim path";
  EXPECT_EQ(0u, st.same_stream_frees);
  run_unheld({origin_, current_, caller_});
  expect_pending(1, kBytes, 0);  // waits on the final fence, which waits on the gate
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  busy.open();
  sync(app);
  finish_reclaims();
  expect_untouched(app, before, "the reclaim");
  const std::vector<arcpool_stream_t> freed = streams_that_freed(mem);
  ASSERT_EQ(1u, freed.size());
  EXPECT_NE(app, freed[0]) << "the reclaim stream frees";
  EXPECT_EQ(0u, stats().reclaim_failures);
}

TEST_P(RetiredStreams, ADestroyedCurrentStreamsImplicitFreeGoesThroughTheReclaimPath) {
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
  arcpool_allocation_t* a = allocate(kBytes, doomed);
  void* const mem = data(a);
  const uint64_t doomed_id = placement(a).origin_stream_id;
  // The deterministic driver runs a destroyed stream's queued work at the destroy, so a gate
  // there would be a deadlock: it destroys an idle stream.
  gate* busy = deterministic() ? nullptr : &block(doomed);
  fill_async(doomed, mem, kBytes, 0x32);
  auto done = mark(doomed);
  const uint64_t used = pool_used();
  ASSERT_OK(arcpool_stream_destroy(alloc_, doomed));  // queued work still runs
  arcpool_allocation_release(a);
  const arcpool_stats_t st = stats();
  EXPECT_EQ(1u, st.implicit_frees);
  EXPECT_EQ(1u, st.deferred_frees) << "through the reclaim path";
  EXPECT_EQ(0u, st.same_stream_frees);
  if (busy != nullptr) {
    run_unheld({origin_, current_, caller_});
    expect_pending(1, kBytes, 0);
    if (on_host()) {
      EXPECT_EQ(used, pool_used());
    }
    busy->open();
  }
  while (!done->reached())
    std::this_thread::yield();  // a destroyed stream cannot be synchronized: wait for its marker
  finish_reclaims();
  const std::vector<arcpool_stream_t> freed = streams_that_freed(mem);
  ASSERT_EQ(1u, freed.size());
  // By identity: the reclaim stream, created after the destroy, may have its handle.
  uint64_t freed_id = 0;
  EXPECT_OK(core().drv().stream_id(freed[0], &freed_id));
  EXPECT_NE(doomed_id, freed_id) << "freed on the destroyed stream";
  EXPECT_EQ(0u, stats().reclaim_failures) << "a call on the destroyed stream failed";
  EXPECT_EQ(1u, stats().frees);
}

TEST_P(RetiredStreams, ExplicitFreesWithAnUnregisteredCurrentStreamNeverEnqueueOnIt) {
  for (uint32_t flag : {uint32_t{ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE},
                        uint32_t{ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN},
                        uint32_t{ARCPOOL_DEALLOCATE_FLAG_DEFERRED}, uint32_t{0}}) {
    SCOPED_TRACE(flag);
    arcpool_stream_t app = registered();
    arcpool_allocation_t* a = allocate(kBytes, origin_);
    void* const mem = data(a);
    EXPECT_OK(arcpool_transfer(a, app));
    gate& busy = block(app);
    fill_async(app, mem, kBytes, 0x33);
    ASSERT_OK(arcpool_stream_unregister(alloc_, app));
    const uint64_t before = work_enqueued(app);
    const uint64_t frees = stats().frees;
    const size_t logged = frees_enqueued().size();
    EXPECT_OK(arcpool_deallocate_async(a, caller_, flag));
    expect_untouched(app, before, "the deallocation");
    run_unheld({origin_, current_, caller_});
    expect_pending(1, kBytes, frees);  // the reclaim path, waiting on the final fence
    busy.open();
    sync(app);
    finish_reclaims();
    expect_untouched(app, before, "the reclaim");
    EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, streams_that_freed(mem, logged));
    arcpool_allocation_release(a);
  }
}

/// Once unregistered, the current stream is an application stream again, and the application
/// may go on using the memory there until it deallocates: a deallocation on that stream's handle
/// waits for the work queued since, not only for the retired entry's final fence.
TEST_P(RetiredStreams, ADeallocationOnItsUnregisteredCurrentStreamWaitsForTheWorkQueuedSince) {
  arcpool_stream_t app = registered();
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  void* const mem = data(a);
  EXPECT_OK(arcpool_transfer(a, app));
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  // The final fence completes before the gate: a free that waited on it alone would be due at
  // the first reclaim pass, whatever the timing of the stream's worker.
  sync(app);
  gate& busy = block(app);  // after the final fence
  fill_async(app, mem, kBytes, 0x35);
  const uint64_t frees = stats().frees;
  const size_t logged = frees_enqueued().size();
  EXPECT_OK(arcpool_deallocate_async(a, app, 0));
  run_unheld({origin_, current_, caller_});
  expect_pending(1, kBytes, frees);  // waiting for the fill, queued after the final fence
  busy.open();
  sync(app);
  finish_reclaims();
  EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, streams_that_freed(mem, logged));
  arcpool_allocation_release(a);
}

/// A use recorded of an allocation's retired current stream is waited for, by an explicit free
/// from another stream and by a dropped last claim (freed on the current stream: the retired
/// entry), whether the stream was registered again or stays unregistered:
/// - registered again, it is a new stream to arcpool: the allocation keeps the retired entry (its
///   final fence), and the use is a use like any other's. Before, the record matched the current
///   stream's id and was dropped as covered by its order, and the free waited on the final fence
///   alone;
/// - left unregistered, a use recorded since is work its final fence does not cover (an event
///   covers what was queued before its record), and arcpool never enqueues on it again. The use
///   is fenced when it is recorded, as any unregistered stream's (§6); it was dropped the same way.
TEST_P(RetiredStreams, AUseRecordedOfItsRetiredCurrentStreamIsWaitedFor) {
  for (const bool registered_again : {true, false}) {
    for (const bool explicit_free : {true, false}) {
      SCOPED_TRACE(registered_again ? "registered again" : "left unregistered");
      SCOPED_TRACE(explicit_free ? "an explicit free from another stream" : "a dropped last claim");
      arcpool_stream_t app = registered();
      arcpool_allocation_t* a = allocate(kBytes, origin_);
      void* const mem = data(a);
      EXPECT_OK(arcpool_transfer(a, app));
      ASSERT_OK(arcpool_stream_unregister(alloc_, app));
      if (registered_again) {
        ASSERT_OK(arcpool_stream_register(alloc_, app));
      }
      sync(app);  // the final fence completed: a free waiting on it alone is due at once
      gate& busy = block(app);
      fill_async(app, mem, kBytes, 0x36);
      EXPECT_OK(arcpool_record_use(a, app));
      const uint64_t frees = stats().frees;
      if (explicit_free) {
        EXPECT_OK(arcpool_deallocate_async(a, caller_, 0));
        arcpool_allocation_release(a);
      } else {
        EXPECT_OK(arcpool_allocation_discard_and_release(a));
      }
      run_unheld({origin_, current_, caller_});
      expect_pending(1, kBytes, frees);  // waiting for the fill
      busy.open();
      sync(app);
      finish_reclaims();
      EXPECT_EQ(frees + 1, stats().frees);
      if (registered_again) {
        ASSERT_OK(arcpool_stream_unregister(alloc_, app));
      }
    }
  }
}

TEST_P(RetiredStreams, AUseRecordOnAStreamUnregisteredSinceIsCoveredByItsFinalFence) {
  arcpool_stream_t app = registered();
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  void* const mem = data(a);
  sync(origin_);  // a use on another stream must be ordered after the allocation
  EXPECT_OK(arcpool_record_use(a, app));  // fenced at deallocation: app is registered
  gate& busy = block(app);
  fill_async(app, mem, kBytes, 0x34);
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  const uint64_t before = work_enqueued(app);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, origin_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  expect_untouched(app, before, "the use record's fence");
  auto after_free = mark(origin_);
  settle(origin_);
  EXPECT_FALSE(after_free->reached()) << "the free did not wait for the final fence";
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  busy.open();
  sync(origin_);
  EXPECT_TRUE(after_free->reached());
  EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, streams_that_freed(mem));
  arcpool_allocation_release(a);
}

/// Once unregistered, a stream is the application's again: it may destroy it at once. Every
/// later call on it would fail on the host drivers (and be undefined on CUDA), so each free of
/// an allocation that named it must succeed without one.
TEST_P(RetiredStreams, AStreamDestroyedByTheApplicationAfterItsUnregistrationIsNeverCalled) {
  arcpool_stream_t app = registered();
  arcpool_allocation_t* origin_there = allocate(kBytes, app);    // origin app, current moved away
  arcpool_allocation_t* current_there = allocate(kBytes, app);   // origin and current app
  arcpool_allocation_t* used_there = allocate(kBytes, origin_);  // a use recorded on app
  void* const moved = data(origin_there);
  EXPECT_OK(arcpool_transfer(origin_there, current_));
  sync(app);
  sync(origin_);
  EXPECT_OK(arcpool_record_use(used_there, app));
  fill_async(app, data(current_there), kBytes, 0x35);
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  destroy_app_stream(app);
  EXPECT_OK(arcpool_deallocate_async(origin_there, caller_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  EXPECT_OK(arcpool_deallocate_async(used_there, caller_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  arcpool_allocation_release(current_there);  // the implicit free, through the reclaim path
  sync(caller_);
  sync(current_);
  finish_reclaims();
  const arcpool_stats_t st = stats();
  EXPECT_EQ(0u, st.reclaim_failures) << "a call on the destroyed stream failed";
  EXPECT_EQ(3u, st.frees);
  EXPECT_EQ(0u, st.bytes_held_current);
  EXPECT_EQ(std::vector<arcpool_stream_t>{caller_}, streams_that_freed(moved));
  arcpool_allocation_release(origin_there);
  arcpool_allocation_release(used_there);
}

// An export asks the current stream whether it captures; another thread destroys that stream
// meanwhile. The question is asked under the stream's liveness guard, so that the destruction
// waits for the answer, and the export then either fences the live stream or finds it gone: it
// was asked of the handle after the check that the stream lived, and simcuda saw the destroyed
// stream asked.
TEST_P(RetiredStreams, AStreamIsNeverAskedWhetherItCapturesOnceDestroyed) {
  if (GetParam().kind != ARCPOOL_DRIVER_CUDA || !on_simcuda()) {
    GTEST_SKIP() << "the CUDA driver on simcuda, whose pause points open the window";
  }
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
  arcpool_allocation_t* a = allocate(kBytes, doomed);
  cudaEvent_t allocated = nullptr;  // orders the exported memory's free after its allocation
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&allocated, cudaEventDisableTiming));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(allocated, static_cast<cudaStream_t>(doomed)));
  ASSERT_TRUE(simcuda_delay_calls("cudaStreamIsCapturing", 300));
  std::atomic<bool> asking{false};
  void* exported = nullptr;
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  std::string why;
  std::thread exporter([&] {
    asking = true;
    status = arcpool_allocation_export(a, &exported);
    why = arcpool_last_error();
  });
  while (!asking.load())
    std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // paused in the question now
  simcuda_delay_calls("cudaStreamIsCapturing", 0);  // the destroying thread's own is not held
  EXPECT_OK(arcpool_stream_destroy(alloc_, doomed));
  exporter.join();
  EXPECT_TRUE(status == ARCPOOL_STATUS_SUCCESS ||
              (status == ARCPOOL_STATUS_UNSUPPORTED && why.find("destroyed") != std::string::npos))
      << why;
  EXPECT_EQ("", take_simcuda_violations());
  arcpool_allocation_release(a);
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(static_cast<cudaStream_t>(caller_), allocated, 0));
  ASSERT_EQ(cudaSuccess, cudaEventDestroy(allocated));
  if (exported != nullptr) free_exported(exported, kBytes, caller_);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(RetiredStreams);
/// A before-free hook that holds the freeing thread, once every check and wait of its free is
/// done and before the free is enqueued, until the test lets it go.
struct held_free {
  std::atomic<bool> reached{false};
  std::atomic<bool> go{true};
  static void hook(void*, size_t, arcpool_stream_t, void* self) {
    auto* h = static_cast<held_free*>(self);
    if (h->go.load()) return;
    h->reached = true;
    while (!h->go.load())
      std::this_thread::yield();
  }
};

/// Frees on a current stream the caller did not name, while another thread destroys it.
class RetiringWhileFreeing : public RetiredStreams {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.before_free = &held_free::hook;
    options.before_free_user_data = &held_;
  }
  /// Frees `a` with `drop` on another thread, held just before its free is enqueued on `a`'s
  /// current stream `s`, destroys `s` meanwhile on a third, then lets the free go: the destroy
  /// must wait for it (design.md §6), and both succeed.
  template <class Drop>
  void free_while_destroying(arcpool_allocation_t* a, arcpool_stream_t s, Drop drop) {
    held_.go = false;
    held_.reached = false;
    arcpool_status_t freed = ARCPOOL_STATUS_SUCCESS, destroyed = ARCPOOL_STATUS_SUCCESS;
    std::string why;
    std::thread freeing([&] {
      freed = drop(a);
      why = arcpool_last_error();
    });
    while (!held_.reached.load())
      std::this_thread::yield();
    std::thread destroying([&] { destroyed = arcpool_stream_destroy(alloc_, s); });
    // A destroy that does not wait for the free is done by now.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    held_.go = true;
    freeing.join();
    destroying.join();
    EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, freed) << why;
    EXPECT_OK(destroyed);
    finish_reclaims();
    EXPECT_EQ(0u, stats().reclaim_failures);
    EXPECT_EQ(0u, stats().bytes_in_use_current);
  }
  held_free held_;
};

TEST_P(RetiringWhileFreeing, ADroppedLastClaimsFreeHoldsOffTheDestroyOfItsCurrentStream) {
  arcpool_stream_t s = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &s));
  free_while_destroying(allocate(kBytes, s), s, &arcpool_allocation_discard_and_release);
}

TEST_P(RetiringWhileFreeing, ALeakedOwnersImplicitFreeHoldsOffTheDestroyOfItsCurrentStream) {
  arcpool_stream_t s = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &s));
  free_while_destroying(allocate(kBytes, s), s, &arcpool_allocation_release);
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(RetiringWhileFreeing);

}  // namespace
}  // namespace arcpool::test
