// design.md §10: every row of the bad-input table, on both drivers. Each misuse gets a clear
// status naming what was wrong and leaves all state intact.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include "drivers/host_stream.hpp"
#include "support/driver_test.hpp"
#include "support/simcuda_probe.hpp"
#include "support/stream_probe.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 1 << 20;

class Errors : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = make_stream();
  }

  void TearDown() override {
    if (alloc_ != nullptr) {
      EXPECT_OK(arcpool_default_allocator_set(0, nullptr));
    }
    DriverTest::TearDown();
  }

  static bool last_error_mentions(const char* text) {
    return std::string(arcpool_last_error()).find(text) != std::string::npos;
  }

  arcpool_stream_t s_ = nullptr;
};

TEST_P(Errors, FreeOfAPointerArcpoolDidNotAllocateIsUnknownPointer) {
  ASSERT_OK(arcpool_default_allocator_set(0, alloc_));
  int on_the_stack = 0;
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_free_async(&on_the_stack, 4, 0, s_));
  arcpool_allocation_t* handle_made = allocate(kBytes, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER,
                arcpool_free_async(data(handle_made), kBytes, 0, s_))
      << "by-pointer calls see only by-pointer allocations";
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(handle_made).state) << "nothing freed";
  EXPECT_EQ(0u, stats().deallocations);
  EXPECT_OK(arcpool_deallocate_async(handle_made, s_, 0));
  arcpool_allocation_release(handle_made);
}

TEST_P(Errors, SecondDeallocationIsAlreadyDeallocated) {
  arcpool_allocation_t* a = allocate(kBytes, s_);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_deallocate_async(a, s_, 0));
  EXPECT_TRUE(last_error_mentions("already deallocated")) << arcpool_last_error();
  EXPECT_TRUE(last_error_mentions("allocation #")) << arcpool_last_error();
  sync(s_);
  EXPECT_EQ(1u, stats().frees);
  arcpool_allocation_release(a);
}

TEST_P(Errors, DoubleFreeByPointerIsUnknownPointerWhileTheAddressIsNotReused) {
  ASSERT_OK(arcpool_default_allocator_set(0, alloc_));
  void* p = arcpool_malloc_async(kBytes, 0, s_);
  ASSERT_NE(nullptr, p) << arcpool_last_error();
  EXPECT_OK(arcpool_free_async(p, kBytes, 0, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_free_async(p, kBytes, 0, s_));
  sync(s_);
  EXPECT_EQ(1u, stats().frees);
}

TEST_P(Errors, DiscardOrPreserveAtOwnerCountZeroIsNotOwner) {
  arcpool_allocation_t* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_allocation_discard(a, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_allocation_preserve(a));
  EXPECT_TRUE(last_error_mentions("owner count is 0")) << arcpool_last_error();
  EXPECT_EQ(0u, info(a).owners);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(Errors, DeallocateWithOtherOwnersIsNotOwnerUnlessForced) {
  arcpool_allocation_t* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_, 2);
  EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_deallocate_async(a, s_, 0));
  EXPECT_TRUE(last_error_mentions("FORCE")) << arcpool_last_error();
  EXPECT_EQ(2u, info(a).owners);
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_FORCE));
  arcpool_allocation_release(a);
}

TEST_P(Errors, EveryOperationAfterDeallocationIsAlreadyDeallocated) {
  arcpool_allocation_t* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  arcpool_allocation_t* v = nullptr;
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_preserve(a));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_discard(a, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_transfer(a, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_record_use(a, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_view(a, 0, 1, &v));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_export(a, &p));
  EXPECT_EQ(ARCPOOL_ALLOCATION_DEALLOCATED, info(a).state);
  arcpool_allocation_release(a);
}

TEST_P(Errors, PreferOriginToAnOriginNotProvablyAliveFallsBackWithoutTouchingIt) {
  // The origin is an unregistered application stream that is no longer the current stream:
  // arcpool may not enqueue anything on it.
  arcpool_stream_t app = make_app_stream();
  arcpool_allocation_t* a = allocate(kBytes, app);
  EXPECT_OK(arcpool_transfer(a, s_));
  sync(app);
  const uint64_t touched = on_host() ? detail::host_stream_find(app)->enqueued() : 0;
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  EXPECT_EQ(1u, stats().origin_fallbacks);
  if (on_host()) {
    EXPECT_EQ(touched, detail::host_stream_find(app)->enqueued()) << "the origin was touched";
  }
  arcpool_allocation_release(a);
}

TEST_P(Errors, AbsurdSizesAreOutOfMemoryAndThePoolStaysUsable) {
  arcpool_allocation_t* a = nullptr;
  const size_t one_pib = size_t{1} << 50;
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                arcpool_allocate_async(alloc_, one_pib, 0, s_, 0, &a));
  EXPECT_EQ(nullptr, a);
  EXPECT_TRUE(last_error_mentions(std::to_string(one_pib).c_str())) << arcpool_last_error();
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                arcpool_allocate_async(alloc_, SIZE_MAX, 4096, s_, 0, &a));
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                arcpool_allocate_async(alloc_, SIZE_MAX, 0, s_, 0, &a));
  const auto st = stats();
  EXPECT_EQ(3u, st.oom_failures);
  EXPECT_EQ(0u, st.bytes_held_current) << "a failed attempt holds nothing";
  arcpool_allocation_t* b = allocate(kBytes, s_);
  ASSERT_NE(nullptr, b) << "the pool must stay usable";
  EXPECT_OK(arcpool_deallocate_async(b, s_, 0));
  arcpool_allocation_release(b);
}

// A bound stream operations could not name is refused when it is bound, the policy unchanged:
// it was taken, and every ambient allocation failed later, far from the cause.
TEST_P(Errors, AnAmbientBoundStreamThatIsNoStreamIsRefusedWhenBound) {
  if (GetParam().kind == ARCPOOL_DRIVER_CUDA) {
    GTEST_SKIP() << "a destroyed stream's handle is undefined behaviour to pass to CUDA";
  }
  arcpool_stream_t gone = nullptr;  // not the fixture's: it would synchronize it at the end
  ASSERT_OK(arcpool_stream_create(alloc_, &gone));
  ASSERT_OK(arcpool_stream_destroy(alloc_, gone));
  EXPECT_NE(ARCPOOL_STATUS_SUCCESS,
            arcpool_allocator_set_ambient_stream(alloc_, ARCPOOL_AMBIENT_BOUND_STREAM, gone));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_allocator_set_ambient_stream(
                    alloc_, static_cast<arcpool_ambient_policy_t>(7), nullptr));
  void* p = nullptr;  // the policy stands: the legacy default stream
  ASSERT_OK(arcpool_ambient_malloc(alloc_, kBytes, &p));
  EXPECT_OK(arcpool_ambient_free(alloc_, p));
  ASSERT_OK(arcpool_allocator_set_ambient_stream(alloc_, ARCPOOL_AMBIENT_BOUND_STREAM, s_));
  ASSERT_OK(arcpool_ambient_malloc(alloc_, kBytes, &p));
  EXPECT_OK(arcpool_ambient_free(alloc_, p));
  sync(s_);
}

TEST_P(Errors, BadAlignmentsAreInvalidArguments) {
  arcpool_allocation_t* a = nullptr;
  for (size_t alignment : {size_t{3}, size_t{100}, size_t{4097}, ARCPOOL_MAX_ALIGNMENT * 2}) {
    EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  arcpool_allocate_async(alloc_, kBytes, alignment, s_, 0, &a))
        << alignment;
    EXPECT_TRUE(last_error_mentions("alignment")) << arcpool_last_error();
  }
  EXPECT_EQ(nullptr, a);
  ASSERT_OK(arcpool_allocate_async(alloc_, kBytes, ARCPOOL_MAX_ALIGNMENT, s_, 0, &a));
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(data(a)) % ARCPOOL_MAX_ALIGNMENT);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_allocate_async(alloc_, kBytes, 0, s_, 1u << 7, &a))
      << "unknown allocation flags";
}

TEST_P(Errors, NullArgumentsAreInvalidArguments) {
  arcpool_allocation_t* a = allocate(kBytes, s_);
  arcpool_allocation_t* out = nullptr;
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_allocate_async(nullptr, kBytes, 0, s_, 0, &out));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_allocate_async(alloc_, kBytes, 0, s_, 0, nullptr));
  EXPECT_TRUE(last_error_mentions("out_allocation")) << arcpool_last_error();
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_deallocate_async(nullptr, s_, 0));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_preserve(nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_discard(nullptr, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_retain(nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_transfer(nullptr, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_record_use(nullptr, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_data(a, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_data(nullptr, &p));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_view(a, 0, 1, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_export(a, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_placement(a, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_info(nullptr, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_create(alloc_, nullptr));
  arcpool_stream_t no_stream = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stream_create(nullptr, &no_stream));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stats_get(alloc_, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(nullptr, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_record_stream(nullptr, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_synchronize_device(nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT,
                arcpool_stream_launch_host_func(alloc_, s_, nullptr, nullptr));
  EXPECT_EQ(0, arcpool_allocation_is_terminal(nullptr));
  EXPECT_EQ(0u, arcpool_allocation_size(nullptr));
  EXPECT_OK(arcpool_allocation_release(nullptr));
  arcpool_allocator_destroy(nullptr);
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(a).state);
  EXPECT_EQ(1u, info(a).owners);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(Errors, AStreamArcpoolHasNotSeenIsCheckedForCaptureBeforeItsIdIsAsked) {
  // Whether cudaStreamGetId is legal during capture is not documented (CCCL treats it as
  // invalidating): arcpool asks for the capture status first. simcuda counts the calls.
  arcpool_stream_t app = make_app_stream();  // never passed to arcpool before
  ASSERT_OK(core().drv().stream_begin_capture(app));
  reset_simcuda_calls();
  arcpool_allocation_t* out = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED,
                arcpool_allocate_async(alloc_, kBytes, 0, app, 0, &out));
  EXPECT_TRUE(last_error_mentions("capturing")) << arcpool_last_error();
  if (!on_host() && on_simcuda()) {
    EXPECT_EQ(0u, simcuda_calls("cudaStreamGetId")) << "an id asked of a capturing stream";
    // Its capture status, then its capture's id (is it bound to a graph pool?), which simcuda's
    // cudaStreamGetCaptureInfo counts as one more status query.
    EXPECT_EQ(2u, simcuda_calls("cudaStreamIsCapturing"));
  }
  EXPECT_OK(core().drv().stream_end_capture(app));
}

TEST_P(Errors, SynchronizingACapturingStreamIsUnsupportedAndKeepsTheCapture) {
  arcpool_stream_t capturing = make_stream();
  ASSERT_OK(core().drv().stream_begin_capture(capturing));
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_stream_synchronize(alloc_, capturing));
  EXPECT_TRUE(last_error_mentions("capturing")) << arcpool_last_error();
  bool still = false;
  ASSERT_OK(core().drv().stream_is_capturing(capturing, &still));
  EXPECT_TRUE(still);
  EXPECT_OK(core().drv().stream_end_capture(capturing)) << "the capture was invalidated";
  EXPECT_OK(arcpool_stream_synchronize(alloc_, capturing));
}

/// What stays UNSUPPORTED on a capturing stream. The CUDA driver allocates and deallocates
/// there (graph_capture_test.cpp); the host drivers build no graphs and refuse those too.
TEST_P(Errors, ACapturingStreamIsUnsupportedAndNothingChanges) {
  arcpool_stream_t capturing = make_stream();
  arcpool_allocation_t* a = allocate(kBytes, s_);
  arcpool_allocation_t* on_capturing = allocate(kBytes, capturing);
  ASSERT_OK(core().drv().stream_begin_capture(capturing));
  arcpool_allocation_t* out = nullptr;
  const bool graphs = core().drv().supports_graphs();
  if (!graphs) {
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED,
                  arcpool_allocate_async(alloc_, kBytes, 0, capturing, 0, &out));
    EXPECT_TRUE(last_error_mentions("capturing")) << arcpool_last_error();
  }
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_transfer(a, capturing));
  EXPECT_TRUE(last_error_mentions("capturing")) << arcpool_last_error();
  EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_record_use(a, capturing));
  if (!graphs) {
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_deallocate_async(a, capturing, 0));
  }
  // The allocation whose current stream captures cannot be fenced from elsewhere either.
  for (uint32_t flag : {uint32_t{0}, uint32_t{ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE},
                        uint32_t{ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN},
                        uint32_t{ARCPOOL_DEALLOCATE_FLAG_DEFERRED}}) {
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_deallocate_async(on_capturing, s_, flag));
  }
  EXPECT_EQ(nullptr, out);
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(a).state);
  EXPECT_EQ(s_, info(a).current_stream);
  EXPECT_EQ(0u, info(a).use_records);
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, info(on_capturing).state);
  EXPECT_EQ(0u, stats().deallocations);
  ASSERT_OK(core().drv().stream_end_capture(capturing));
  // Everything works again once the capture ended.
  EXPECT_OK(arcpool_transfer(a, capturing));
  EXPECT_OK(arcpool_deallocate_async(a, capturing, 0));
  EXPECT_OK(arcpool_deallocate_async(on_capturing, capturing, 0));
  arcpool_allocation_release(a);
  arcpool_allocation_release(on_capturing);
}

TEST_P(Errors, GraphPoolsNeedTheCudaDriver) {
  arcpool_graph_pool_t* pool = nullptr;
  if (core().drv().supports_graphs()) {
    ASSERT_OK(arcpool_graph_pool_create(alloc_, &pool));
    EXPECT_NE(nullptr, pool);
  } else {
    EXPECT_STATUS(ARCPOOL_STATUS_UNSUPPORTED, arcpool_graph_pool_create(alloc_, &pool));
    EXPECT_EQ(nullptr, pool);
  }
  EXPECT_OK(arcpool_graph_pool_release(pool));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_graph_pool_create(alloc_, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_graph_pool_begin(nullptr, s_));
}

/// design.md §7: before out-of-memory is reported, pending reclaims are completed.
class OutOfMemory : public Errors {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.hard_limit_bytes = 3 * kBytes;
    options.on_out_of_memory = [](size_t, void* user_data) {
      return static_cast<OutOfMemory*>(user_data)->on_oom();
    };
    options.on_out_of_memory_user_data = this;
  }
  int on_oom() {
    callbacks_.fetch_add(1);
    if (spare_ == nullptr) return 0;
    // The callback may free memory and ask for a retry.
    arcpool_status_t status = arcpool_deallocate_async(spare_, s_, 0);
    arcpool_allocation_release(spare_);
    spare_ = nullptr;
    return status == ARCPOOL_STATUS_SUCCESS ? 1 : 0;
  }

  std::atomic<int> callbacks_{0};
  arcpool_allocation_t* spare_ = nullptr;
};

TEST_P(OutOfMemory, TheHardLimitIsEnforcedAndTheAllocatorStaysUsable) {
  arcpool_allocation_t* a = allocate(2 * kBytes, s_);
  arcpool_allocation_t* b = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                arcpool_allocate_async(alloc_, 2 * kBytes, 0, s_, 0, &b));
  EXPECT_TRUE(last_error_mentions("hard limit")) << arcpool_last_error();
  EXPECT_TRUE(last_error_mentions("2097152")) << "names the bytes: " << arcpool_last_error();
  EXPECT_EQ(1, callbacks_.load());
  EXPECT_EQ(1u, stats().oom_retries);
  EXPECT_EQ(1u, stats().oom_failures);
  b = allocate(kBytes, s_);
  EXPECT_NE(nullptr, b) << "what fits still fits";
  for (auto* h : {a, b}) {
    EXPECT_OK(arcpool_deallocate_async(h, s_, 0));
    arcpool_allocation_release(h);
  }
}

TEST_P(OutOfMemory, AHardLimitBeyondWhatTheHeldBytesCountCanHoldLimitsNothing) {
  // SIZE_MAX, a caller's "no limit", is past the int64_t the held bytes count in: it limits
  // nothing (it refused every allocation once taken as a negative count).
  EXPECT_OK(arcpool_allocator_set_hard_limit(alloc_, SIZE_MAX));
  arcpool_allocation_t* a = allocate(2 * kBytes, s_);
  arcpool_allocation_t* b = allocate(2 * kBytes, s_);  // past the fixture's limit of 3
  EXPECT_NE(nullptr, a) << arcpool_last_error();
  EXPECT_NE(nullptr, b) << arcpool_last_error();
  EXPECT_EQ(0, callbacks_.load());
  for (auto* h : {a, b}) {
    if (h == nullptr) continue;
    EXPECT_OK(arcpool_deallocate_async(h, s_, 0));
    arcpool_allocation_release(h);
  }
}

TEST_P(OutOfMemory, ARequestPastWhatTheHeldBytesCountCanHoldIsRefusedUnderAHardLimit) {
  // Held bytes count in an int64_t: a request past INT64_MAX counted as negative bytes, passed
  // the limit's test and took the held bytes down while the pool was asked (other threads'
  // requests then passed the limit). It is refused before the limit and the pool see it: no
  // out-of-memory retry (a flush, a drain and a wait for every stream) either.
  arcpool_allocation_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                arcpool_allocate_async(alloc_, SIZE_MAX / 4 * 3, 0, s_, 0, &a));
  EXPECT_EQ(nullptr, a);
  EXPECT_EQ(0u, stats().oom_retries) << "the pool was asked";
  EXPECT_EQ(0u, stats().bytes_held_current);
  EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                arcpool_allocate_async(alloc_, 10 * kBytes, 0, s_, 0, &a))
      << "past the fixture's limit of 3";
  if (a != nullptr) {
    EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
  }
}

TEST_P(OutOfMemory, PendingReclaimsCompleteBeforeOutOfMemoryIsReported) {
  arcpool_stream_t busy = make_stream();
  arcpool_allocation_t* a = allocate(2 * kBytes, s_);
  EXPECT_OK(arcpool_record_use(a, busy));
  gate& held = block(busy);
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  arcpool_allocation_release(a);
  EXPECT_EQ(1u, core().reclaim_pending());
  // Opens the gate only once the allocation below entered the out-of-memory path, so that the
  // memory can only come back through that path's reclaim.
  std::thread opener([&] {
    while (stats().oom_retries == 0)
      std::this_thread::yield();
    held.open();
  });
  arcpool_allocation_t* b = nullptr;
  EXPECT_OK(arcpool_allocate_async(alloc_, 2 * kBytes, 0, s_, 0, &b));
  opener.join();
  EXPECT_EQ(1u, stats().oom_retries);
  EXPECT_EQ(0u, stats().oom_failures);
  EXPECT_EQ(0, callbacks_.load());
  EXPECT_OK(arcpool_deallocate_async(b, s_, 0));
  arcpool_allocation_release(b);
}

TEST_P(OutOfMemory, TheCallbackMayFreeMemoryAndAskForARetry) {
  spare_ = allocate(2 * kBytes, s_);
  arcpool_allocation_t* b = nullptr;
  EXPECT_OK(arcpool_allocate_async(alloc_, 2 * kBytes, 0, s_, 0, &b));
  EXPECT_EQ(1, callbacks_.load());
  EXPECT_EQ(0u, stats().oom_failures);
  EXPECT_OK(arcpool_deallocate_async(b, s_, 0));
  arcpool_allocation_release(b);
}

/// A pool of 64 MiB (the CUDA pool's maximum size; the host pool's capacity). Not smaller: on an
/// H200 a pool of 4 MiB held two live blocks of 3 MiB (bench/results/2026-12-04-h200), so a
/// small maximum size is not exact there; 64 MiB refused 128 MiB (the conformance suite).
class SmallPool : public Errors {
 protected:
  static constexpr size_t kPoolBytes = size_t{64} << 20;
  static constexpr size_t kBlockBytes = size_t{40} << 20;  // two do not fit
  void customize(arcpool_allocator_options_t& options) override {
    options.max_pool_bytes = kPoolBytes;
    options.host_capacity_bytes = kPoolBytes;
  }
};

TEST_P(SmallPool, TheRetryWaitsForFreesQueuedOnArcpoolsOtherStreams) {
  // A pool lends a block freed on another stream only once that free ran (owned pools allow no
  // hidden waits): near capacity, the retry must let the frees queued on arcpool's streams run.
  arcpool_stream_t x = make_stream();
  arcpool_allocation_t* a = allocate(kBlockBytes, x);
  gate& held = block(x);
  EXPECT_OK(arcpool_deallocate_async(a, x, 0));  // same stream: a pool free queued behind the gate
  arcpool_allocation_release(a);
  std::atomic<bool> returned{false};
  // Opens the gate once the allocation below entered the out-of-memory path (or returned).
  std::thread opener([&] {
    while (stats().oom_retries == 0 && !returned.load())
      std::this_thread::yield();
    held.open();
  });
  arcpool_allocation_t* b = nullptr;
  EXPECT_OK(arcpool_allocate_async(alloc_, kBlockBytes, 0, s_, 0, &b));
  returned = true;
  opener.join();
  EXPECT_EQ(1u, stats().oom_retries);
  EXPECT_EQ(0u, stats().oom_failures);
  if (b != nullptr) {
    EXPECT_OK(arcpool_deallocate_async(b, s_, 0));
    arcpool_allocation_release(b);
  }
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(Errors);
ARCPOOL_INSTANTIATE_FOR_DRIVERS(SmallPool);
ARCPOOL_INSTANTIATE_FOR_DRIVERS(OutOfMemory);

/// A sticky error (a device fault) surfaces as CUDA_ERROR with its name, and nothing hangs.
/// On the host driver the fault is injected; on a GPU it comes from a faulting kernel (the
/// stress and fault tests of tools/device-check).
TEST(StickyError, IsReportedAsCudaErrorWithItsNameAndNothingHangs) {
  standalone_host_allocator host;
  ASSERT_NO_FATAL_FAILURE(make_standalone_host_allocator(&host));
  arcpool_allocator_t* alloc = host.alloc;
  arcpool_stream_t s = host.s, other = host.other;
  arcpool_allocation_t* live = nullptr;
  arcpool_allocation_t* pending = nullptr;
  {
#if defined(__SANITIZE_ADDRESS__)
    // Memory of a faulted device cannot be given back: a dead GPU leaks it too.
    __lsan::ScopedDisabler leaks_expected;
#endif
    ASSERT_OK(arcpool_allocate_async(alloc, kBytes, 0, s, 0, &live));
    ASSERT_OK(arcpool_allocate_async(alloc, kBytes, 0, s, 0, &pending));
  }
  ASSERT_OK(arcpool_deallocate_async(pending, other, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));

  detail::inject_sticky_error(detail::from_handle(alloc)->drv());

  arcpool_allocation_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a));
  EXPECT_NE(std::string(arcpool_last_error()).find("cudaErrorIllegalAddress"), std::string::npos)
      << arcpool_last_error();
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_deallocate_async(live, other, 0));
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_stream_synchronize(alloc, s));
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_allocator_trim(alloc, 0));
  // Teardown with a live allocation and a failed reclaim returns.
  arcpool_allocation_release(live);
  arcpool_allocation_release(pending);
  arcpool_allocator_destroy(alloc);
}

/// An import's on_free says that arcpool no longer uses the memory, every fence complete. A
/// fence that cannot be checked (a sticky error) leaves that unknown, so on_free never comes:
/// the failure is counted, as pool memory is written off rather than freed under a use. (Before,
/// on_free came anyway: an IPC import was then released to its exporter, which freed it, while
/// the other stream's work could still read it.)
TEST(StickyError, AnImportWhoseUsesCannotBeSeenCompleteIsNeverReportedFree) {
  standalone_host_allocator host;
  ASSERT_NO_FATAL_FAILURE(make_standalone_host_allocator(&host));
  arcpool_allocator_t* alloc = host.alloc;
  arcpool_stream_t s = host.s, user = host.other;
  static unsigned char foreign[kBytes];
  std::atomic<int> reported{0};
  const arcpool_on_free_t on_free = [](void*, size_t, void* calls) {
    static_cast<std::atomic<int>*>(calls)->fetch_add(1);
  };
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc, foreign, kBytes, s, 0, on_free, &reported, &a));
  std::unique_ptr<gate> busy = make_host_probe(alloc)->block(user);
  ASSERT_OK(arcpool_record_use(a, user));
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));  // deferred: the user's work still runs
  arcpool_allocation_release(a);

  detail::inject_sticky_error(detail::from_handle(alloc)->drv());
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_allocator_trim(alloc, 0));  // drains it
  EXPECT_EQ(0, reported.load()) << "on_free said arcpool's uses were over, unseen";
  arcpool_stats_t st;
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  ASSERT_OK(arcpool_stats_get(alloc, &st));
  EXPECT_EQ(1u, st.reclaim_failures);
  busy->open();
  arcpool_allocator_destroy(alloc);
  EXPECT_EQ(0, reported.load());
}

}  // namespace
}  // namespace arcpool::test
