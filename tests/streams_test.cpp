// design.md §6: stream identity, liveness (created, registered, retired), default streams,
// the event pool, and several allocators in one process. On both drivers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "drivers/host_stream.hpp"
#include "support/driver_test.hpp"
#include "support/simcuda_probe.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 64 << 10;

class Streams : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = make_stream();
  }

  /// Work arcpool has queued on `s` so far (host driver only).
  uint64_t touched(arcpool_stream_t s) { return detail::host_stream_find(s)->enqueued(); }

  arcpool_stream_t s_ = nullptr;
};

/// Sets `*flag` (a std::atomic<bool>) after 50 ms.
void set_late(void* flag) {
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  static_cast<std::atomic<bool>*>(flag)->store(true);
}

TEST_P(Streams, SynchronizingTheDeviceWaitsForEveryStream) {
  // Frees on streams arcpool does not know are observed only this way (design.md §7, "Trim").
  std::atomic<bool> first{false}, second{false};
  ASSERT_OK(arcpool_stream_launch_host_func(alloc_, s_, &set_late, &first));
  ASSERT_OK(arcpool_stream_launch_host_func(alloc_, make_stream(), &set_late, &second));
  ASSERT_OK(arcpool_allocator_synchronize_device(alloc_));
  EXPECT_TRUE(first.load());
  EXPECT_TRUE(second.load());
}

TEST_P(Streams, IdentityIsTheStreamIdNotTheHandle) {
  // Handles are recycled after destruction; ids never are. An allocation made on a destroyed
  // stream must not take a new stream with the same handle for its origin.
  arcpool_stream_t first = make_app_stream();
  arcpool_allocation_t* a = allocate(kBytes, first);
  const uint64_t first_id = placement(a).origin_stream_id;
  EXPECT_OK(arcpool_transfer(a, s_));
  destroy_app_stream(first);
  std::set<uint64_t> ids{first_id};
  arcpool_stream_t same_handle = nullptr;
  for (int i = 0; i < 64 && same_handle == nullptr; ++i) {
    arcpool_stream_t s = make_app_stream();
    uint64_t id = 0;
    EXPECT_OK(core().drv().stream_id(s, &id));
    EXPECT_TRUE(ids.insert(id).second) << "stream ids must be unique";
    if (s == first) {
      same_handle = s;
    } else {
      destroy_app_stream(s);
    }
  }
  if (same_handle == nullptr) {
    arcpool_allocation_release(a);  // freed on its current stream (LeakSanitizer checks)
    GTEST_SKIP() << "no handle was recycled in 64 tries";
  }
  EXPECT_OK(arcpool_deallocate_async(a, same_handle, 0));
  EXPECT_EQ(0u, stats().same_stream_frees) << "a recycled handle is not the origin";
  EXPECT_EQ(1u, stats().cross_stream_frees);
  arcpool_allocation_release(a);
}

// Registrations are counted: two components may each register a stream (the application, and
// a framework's capture wrapper around its capture), and each withdraws its own. The first
// unregister retired the stream under the other's feet.
TEST_P(Streams, ARegisteredStreamIsProvablyAliveUntilEveryRegistrationIsWithdrawn) {
  arcpool_stream_t app = make_app_stream();
  ASSERT_OK(arcpool_stream_register(alloc_, app));
  ASSERT_OK(arcpool_stream_register(alloc_, app));
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));  // the second registration's
  arcpool_allocation_t* a = allocate(kBytes, app);
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  sync(app);
  EXPECT_EQ(1u, stats().origin_routed_frees) << "registered still, by its first registration";
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));
  arcpool_allocation_t* b = allocate(kBytes, app);
  EXPECT_OK(arcpool_deallocate_async(b, s_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  EXPECT_EQ(1u, stats().origin_fallbacks) << "unregistered: no longer provably alive";
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_unregister(alloc_, app));
  arcpool_allocation_release(a);
  arcpool_allocation_release(b);
}

// A stream arcpool created may be registered too (a framework's wrapper cannot tell it from an
// application's stream): the unregister withdraws that registration alone, and the stream stays
// arcpool's until destroyed. It answered INVALID_ARGUMENT, failing the wrapper's capture end.
TEST_P(Streams, ACreatedStreamRegisteredAgainIsUnregisteredAndStaysArcpools) {
  ASSERT_OK(arcpool_stream_register(alloc_, s_));
  ASSERT_OK(arcpool_stream_unregister(alloc_, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_unregister(alloc_, s_))
      << "a created stream is not registered once its registrations are withdrawn";
  arcpool_allocation_t* a = allocate(kBytes, s_);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0)) << "still arcpool's stream";
  arcpool_allocation_release(a);
  sync(s_);
}

// arcpool.h: a destroy whose cudaStreamDestroy fails has retired the stream already (its
// fences taken, its cache flushed); the failure is reported, and the stream is not arcpool's.
TEST_P(Streams, ADestroyWhoseCudaCallFailsReportsItAndTheStreamIsArcpoolsNoMore) {
  if (GetParam().kind != ARCPOOL_DRIVER_CUDA || !on_simcuda()) {
    GTEST_SKIP() << "injects the failure with simcuda_fail_next";
  }
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
  arcpool_allocation_t* a = allocate(kBytes, doomed);
  ASSERT_OK(arcpool_deallocate_async(a, doomed, 0));  // into its cache
  arcpool_allocation_release(a);
  ASSERT_TRUE(simcuda_fail_next("cudaStreamDestroy", cudaErrorUnknown));
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_stream_destroy(alloc_, doomed));
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "cudaStreamDestroy"))
      << arcpool_last_error();
  EXPECT_EQ(0u, stats().bytes_cached_current) << "its cache was given back";
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_destroy(alloc_, doomed));
  ASSERT_EQ(cudaSuccess, cudaStreamDestroy(static_cast<cudaStream_t>(doomed)));  // the caller's
}

TEST_P(Streams, UnregisteringTakesTheFencesArcpoolStillNeeds) {
  arcpool_stream_t app = make_app_stream();
  ASSERT_OK(arcpool_stream_register(alloc_, app));
  arcpool_allocation_t* a = allocate(kBytes, s_);
  sync(s_);  // a use on another stream must be ordered after the allocation
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_record_use(a, app));  // lazily fenced: app is registered
  gate& busy = block(app);
  fill_async(app, data(a), kBytes, 0x21);
  ASSERT_OK(arcpool_stream_unregister(alloc_, app));  // final fence covers the fill
  const uint64_t before = on_host() ? touched(app) : 0;
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  if (on_host()) {
    EXPECT_EQ(before, touched(app)) << "an unregistered stream is never touched again";
  }
  run_unheld({s_});
  expect_pending(1, kBytes, 0);  // freed before the unregistered stream's work, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  busy.open();
  sync(app);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
  arcpool_allocation_release(a);
}

TEST_P(Streams, DestroyingACreatedStreamKeepsItsWorkFenced) {
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
  arcpool_allocation_t* a = allocate(kBytes, s_);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_transfer(a, doomed));
  gate& busy = block(doomed);
  fill_async(doomed, data(a), kBytes, 0x22);
  auto done = mark(doomed);
  ASSERT_OK(arcpool_stream_destroy(alloc_, doomed));  // queued work still runs
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  run_unheld({s_});
  expect_pending(1, kBytes, 0);  // freed before the destroyed stream's work, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  busy.open();
  sync(s_);
  while (!done->reached())
    std::this_thread::yield();
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_destroy(alloc_, make_app_stream()))
      << "only streams arcpool created can be destroyed through it";
  arcpool_allocation_release(a);
}

TEST_P(Streams, ALeakedOwnerWhoseCurrentStreamWasDestroyedIsStillFreed) {
  arcpool_stream_t doomed = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
  arcpool_allocation_t* a = allocate(kBytes, s_);
  EXPECT_OK(arcpool_transfer(a, doomed));
  fill_async(doomed, data(a), kBytes, 0x23);
  ASSERT_OK(arcpool_stream_destroy(alloc_, doomed));
  arcpool_allocation_release(a);  // the last reference of a live allocation: an implicit free
  sync(s_);
  finish_reclaims();
  const arcpool_stats_t st = stats();
  EXPECT_EQ(1u, st.implicit_frees);
  EXPECT_EQ(0u, st.reclaim_failures) << "the implicit free touched the destroyed stream";
  EXPECT_EQ(1u, st.frees);
  EXPECT_EQ(0u, st.bytes_held_current);
}

TEST_P(Streams, DefaultStreamsCannotBeRegistered) {
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_register(alloc_, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_stream_register(alloc_, reinterpret_cast<arcpool_stream_t>(0x2)));
}

TEST_P(Streams, TheLegacyDefaultStreamIsUsedOnlyWhenPassed) {
  arcpool_allocation_t* on_legacy = allocate(kBytes, nullptr);
  EXPECT_OK(arcpool_deallocate_async(on_legacy, nullptr, 0));
  EXPECT_EQ(1u, stats().same_stream_frees);
  sync(nullptr);
  const uint64_t before = on_host() ? touched(nullptr) : 0;
  arcpool_allocation_t* a = allocate(kBytes, s_);
  arcpool_stream_t other = make_stream();
  EXPECT_OK(arcpool_record_use(a, other));
  EXPECT_OK(arcpool_transfer(a, other));
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  sync(other);
  finish_reclaims();
  if (on_host()) {
    EXPECT_EQ(before, touched(nullptr)) << "arcpool enqueued on the legacy default stream";
  }
  arcpool_allocation_release(on_legacy);
  arcpool_allocation_release(a);
}

TEST_P(Streams, APerThreadDefaultOriginIsNeverRoutedToFromAnotherThread) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  arcpool_allocation_t* a = nullptr;
  uint64_t origin_id = 0;
  std::thread([&] {
    a = allocate(kBytes, per_thread);
    origin_id = placement(a).origin_stream_id;
    sync(per_thread);
  }).join();
  uint64_t mine = 0;
  EXPECT_OK(core().drv().stream_id(per_thread, &mine));
  EXPECT_NE(origin_id, mine) << "the per-thread stream resolves per thread";
  EXPECT_OK(arcpool_deallocate_async(a, per_thread, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  EXPECT_EQ(1u, stats().origin_fallbacks);
  EXPECT_EQ(0u, stats().same_stream_frees);
  sync(per_thread);
  EXPECT_EQ(1u, stats().frees);
  arcpool_allocation_release(a);
}

/// cudaStreamPerThread names the calling thread's own stream, so a handle 0x2 remembered from
/// another thread must never be replayed: not for a fence on the current stream (an explicit
/// free), not for the free of a dropped last claim or of a dropped last reference (§6).
TEST_P(Streams, AnotherThreadsPerThreadDefaultStreamIsNeverEnqueuedOnFromHere) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  arcpool_allocation_t* freed = nullptr;
  arcpool_allocation_t* discarded = nullptr;
  arcpool_allocation_t* leaked = nullptr;
  std::thread([&] {
    freed = allocate(kBytes, per_thread);
    discarded = allocate(kBytes, per_thread);
    leaked = allocate(kBytes, per_thread);
    sync(per_thread);
  }).join();
  const uint64_t mine = on_host() ? touched(per_thread) : 0;
  EXPECT_OK(arcpool_deallocate_async(freed, s_, 0));
  if (on_host()) {
    EXPECT_EQ(mine, touched(per_thread)) << "an explicit free fenced 0x2 on the wrong thread";
  }
  EXPECT_OK(arcpool_allocation_discard_and_release(discarded));
  if (on_host()) {
    EXPECT_EQ(mine, touched(per_thread)) << "a dropped last claim freed on the wrong thread";
  }
  arcpool_allocation_release(leaked);
  if (on_host()) {
    EXPECT_EQ(mine, touched(per_thread)) << "an implicit free enqueued on the wrong thread";
  }
  sync(s_);
  finish_reclaims();
  const arcpool_stats_t st = stats();
  EXPECT_EQ(3u, st.frees);
  EXPECT_EQ(0u, st.same_stream_frees);
  EXPECT_EQ(0u, st.reclaim_failures);
  EXPECT_EQ(0u, st.bytes_held_current);
  arcpool_allocation_release(freed);
}

/// What another thread queued on its per-thread default stream up to an allocation (the
/// allocation itself) or a transfer there (the waits on the donor) orders every free made from
/// here: the fence taken when that stream was named stands for the stream this thread cannot
/// name.
TEST_P(Streams, AFreeFromAnotherThreadWaitsForThePerThreadStreamsAllocationAndTransfer) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  arcpool_allocation_t* allocated = nullptr;
  gate* held = nullptr;
  std::thread([&] {
    held = &block(per_thread);
    allocated = allocate(kBytes, per_thread);  // queued behind the gate
  }).join();
  EXPECT_OK(arcpool_deallocate_async(allocated, s_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  auto after_first = mark(s_);
  settle(s_);
  EXPECT_FALSE(after_first->reached()) << "freed before the other thread's stream allocated it";
  held->open();
  sync(s_);
  EXPECT_TRUE(after_first->reached());

  arcpool_stream_t donor = make_stream();
  arcpool_allocation_t* transferred = allocate(kBytes, donor);
  gate& donor_busy = block(donor);
  fill_async(donor, data(transferred), kBytes, 0x24);
  std::thread([&] { EXPECT_OK(arcpool_transfer(transferred, per_thread)); }).join();
  EXPECT_OK(arcpool_deallocate_async(transferred, s_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  auto after_second = mark(s_);
  settle(s_);
  EXPECT_FALSE(after_second->reached()) << "freed before the donor's work the transfer waited on";
  donor_busy.open();
  sync(s_);
  EXPECT_TRUE(after_second->reached());
  EXPECT_EQ(2u, stats().frees);
  arcpool_allocation_release(allocated);
  arcpool_allocation_release(transferred);
}

/// An import on another thread's per-thread default stream, made after work queued there (the
/// producer of the imported memory), orders what this thread does with it: its fence is taken
/// at the import, as at an allocation. Before, an import took none, and a transfer from here
/// (or a free, whose on_free gives the memory back) waited for nothing.
TEST_P(Streams, AnImportOnThePerThreadStreamOrdersATransferFromAnotherThread) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  static unsigned char foreign[64];  // never touched: arcpool only tracks it
  arcpool_allocation_t* a = nullptr;
  gate* held = nullptr;
  std::thread([&] {
    held = &block(per_thread);  // the producer's work, queued before the import
    EXPECT_OK(arcpool_import(alloc_, foreign, sizeof foreign, per_thread, 0, nullptr, nullptr, &a));
  }).join();
  ASSERT_NE(nullptr, a);
  EXPECT_OK(arcpool_transfer(a, s_));
  auto after = mark(s_);
  settle(s_);
  EXPECT_FALSE(after->reached()) << "the transfer did not wait for the importing thread's stream";
  held->open();
  sync(s_);
  EXPECT_TRUE(after->reached());
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

/// A use another thread records of its per-thread default stream, the allocation's current
/// stream, after more work queued there: a free made from here waits for that work too. (The
/// record did nothing: the current stream's own order covers it, but not for a free from a
/// thread that cannot name that stream.)
TEST_P(Streams, AUseRecordedOfThePerThreadCurrentStreamOrdersAFreeFromAnotherThread) {
  const auto per_thread = reinterpret_cast<arcpool_stream_t>(0x2);
  arcpool_allocation_t* a = nullptr;
  gate* held = nullptr;
  std::thread([&] {
    a = allocate(kBytes, per_thread);
    held = &block(per_thread);  // work queued after the allocation
    EXPECT_OK(arcpool_record_use(a, per_thread));
  }).join();
  ASSERT_NE(nullptr, a);
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  auto after = mark(s_);
  settle(s_);
  EXPECT_FALSE(after->reached()) << "freed before the work the use record covers";
  held->open();
  sync(s_);
  EXPECT_TRUE(after->reached());
  arcpool_allocation_release(a);
}

TEST_P(Streams, FencesComeFromARecycledEventPool) {
  arcpool_stream_t other = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s_);
  for (int i = 0; i < 200; ++i)
    EXPECT_OK(arcpool_transfer(a, i % 2 ? s_ : other));
  EXPECT_EQ(200u, stats().fences_taken);
  EXPECT_LE(core().events().events_created(), 2u) << "events must be recycled, not created";
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

/// design.md §6: an event whose record failed (a capture began) is destroyed, never returned to
/// the event pool, so no later fence reuses an event the capture may hold.
TEST_P(Streams, AnEventWhoseRecordFailedNeverReturnsToThePool) {
  detail::fence_ref first;
  ASSERT_OK(core().events().record(s_, 0, &first));
  EXPECT_EQ(1u, core().events().events_created());
  first = detail::fence_ref();  // back to the pool
  ASSERT_OK(core().drv().stream_begin_capture(s_));
  if (!on_host()) {
    // CUDA records events on a capturing stream (they become captured events); a record fails
    // once the capture is invalidated, here by synchronizing the capturing stream.
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, core().drv().stream_synchronize(s_));
  }
  detail::fence_ref failed;
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, core().events().record(s_, 0, &failed))
      << "the pooled event's record fails on a capturing stream";
  EXPECT_FALSE(failed);
  const arcpool_status_t ended = core().drv().stream_end_capture(s_);
  EXPECT_EQ(on_host() ? ARCPOOL_STATUS_SUCCESS : ARCPOOL_STATUS_UNSUPPORTED, ended);
  detail::fence_ref next;
  ASSERT_OK(core().events().record(s_, 0, &next));
  EXPECT_EQ(2u, core().events().events_created()) << "the failed event was pooled and reused";
}

/// A fence still referenced is never recycled, even with a pool that keeps one event.
class OneEventPool : public Streams {
 protected:
  void customize(arcpool_allocator_options_t& options) override { options.event_pool_capacity = 1; }
};

TEST_P(OneEventPool, AReferencedFenceIsNeverRecycled) {
  arcpool_stream_t app = make_app_stream();
  arcpool_stream_t x = make_stream();
  arcpool_stream_t y = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s_);
  gate& busy = block(app);
  EXPECT_OK(arcpool_record_use(a, app));  // fence taken now, held by the use record
  // Churn the pool: every transfer takes and releases a fence.
  arcpool_allocation_t* churn = allocate(kBytes, x);
  for (int i = 0; i < 16; ++i)
    EXPECT_OK(arcpool_transfer(churn, i % 2 ? x : y));
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  auto after = mark(s_);
  settle(s_);
  EXPECT_FALSE(after->reached()) << "the held fence was recycled and re-recorded";
  busy.open();
  sync(s_);
  EXPECT_TRUE(after->reached());
  EXPECT_OK(arcpool_deallocate_async(churn, y, ARCPOOL_DEALLOCATE_FLAG_FORCE));
  sync(y);
  finish_reclaims();
  arcpool_allocation_release(a);
  arcpool_allocation_release(churn);
}

TEST_P(Streams, SeveralAllocatorsLiveInOneProcess) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = GetParam();
  arcpool_allocator_t* second = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &second));
  arcpool_allocation_t* mine = allocate(kBytes, s_);
  arcpool_allocation_t* theirs = nullptr;
  ASSERT_OK(arcpool_allocate_async(second, 2 * kBytes, 0, s_, 0, &theirs));
  EXPECT_EQ(kBytes, stats().bytes_in_use_current);
  arcpool_stats_t other{};
  other.struct_size = sizeof(other);
  other.version = ARCPOOL_STATS_VERSION;
  EXPECT_OK(arcpool_stats_get(second, &other));
  EXPECT_EQ(2 * kBytes, other.bytes_in_use_current);
  arcpool_allocator_destroy(second);  // its live allocation keeps it alive
  EXPECT_OK(arcpool_deallocate_async(theirs, s_, 0));
  arcpool_allocation_release(theirs);  // the last record: now it is torn down
  EXPECT_OK(arcpool_deallocate_async(mine, s_, 0));
  arcpool_allocation_release(mine);
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(Streams);
ARCPOOL_INSTANTIATE_FOR_DRIVERS(OneEventPool);

}  // namespace
}  // namespace arcpool::test
