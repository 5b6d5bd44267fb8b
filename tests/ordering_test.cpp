// design.md §5–§6: transfer waits on the donors' fences; use records order frees and transfers;
// implicit frees of leaked owners are stream-ordered. Proven with gates, on both drivers.
#include <gtest/gtest.h>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 256 << 10;

class Ordering : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    origin_ = make_stream();
    other_ = make_stream();
    third_ = make_stream();
  }

  arcpool_stream_t origin_ = nullptr;
  arcpool_stream_t other_ = nullptr;
  arcpool_stream_t third_ = nullptr;
};

TEST_P(Ordering, TransferMakesTheReceiverWaitForTheDonor) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  gate& donor_busy = block(origin_);
  fill_async(origin_, data(a), kBytes, 0x01);
  EXPECT_OK(arcpool_transfer(a, other_));
  fill_async(other_, data(a), kBytes, 0x02);  // must land after the donor's write
  auto receiver = mark(other_);
  settle(other_);
  EXPECT_FALSE(receiver->reached()) << "the receiver ran before the donor's work";
  donor_busy.open();
  sync(other_);
  EXPECT_TRUE(receiver->reached());
  expect_filled(data(a), kBytes, 0x02);
  EXPECT_EQ(other_, info(a).current_stream);
  EXPECT_EQ(1u, stats().transfers);
  EXPECT_OK(arcpool_deallocate_async(a, other_, 0));
  arcpool_allocation_release(a);
}

TEST_P(Ordering, TransferWaitsOnRecordedUsesAndClearsThem) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  EXPECT_OK(arcpool_record_use(a, third_));
  gate& user_busy = block(third_);
  EXPECT_EQ(1u, info(a).use_records);
  EXPECT_OK(arcpool_transfer(a, other_));
  EXPECT_EQ(0u, info(a).use_records) << "the receiver's fence covers the old uses";
  auto receiver = mark(other_);
  settle(other_);
  EXPECT_FALSE(receiver->reached()) << "the receiver must wait on the recorded user";
  user_busy.open();
  sync(other_);
  EXPECT_TRUE(receiver->reached());
  EXPECT_OK(arcpool_deallocate_async(a, other_, 0));
  arcpool_allocation_release(a);
}

TEST_P(Ordering, TransferToTheCurrentStreamAddsNoWait) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  EXPECT_OK(arcpool_transfer(a, origin_));
  EXPECT_EQ(0u, stats().fences_taken);
  EXPECT_OK(arcpool_deallocate_async(a, origin_, 0));
  arcpool_allocation_release(a);
}

TEST_P(Ordering, DeallocationWaitsForARecordedUseOnAKnownStream) {
  // `third_` was created by arcpool: the fence is taken at deallocation, so work queued on it
  // after record_use is covered too.
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  sync(origin_);  // a use on another stream must be ordered after the allocation
  EXPECT_OK(arcpool_record_use(a, third_));
  EXPECT_EQ(0u, stats().fences_taken) << "a known stream is fenced lazily";
  gate& user_busy = block(third_);
  fill_async(third_, data(a), kBytes, 0x33);
  EXPECT_OK(arcpool_deallocate_async(a, origin_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  auto after_free = mark(origin_);
  settle(origin_);
  EXPECT_FALSE(after_free->reached());
  user_busy.open();
  sync(origin_);
  EXPECT_TRUE(after_free->reached());
  arcpool_allocation_release(a);
}

TEST_P(Ordering, RecordUseOnAnUnregisteredStreamFencesAtRecordTime) {
  arcpool_stream_t app = make_app_stream();
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  sync(origin_);  // a use on another stream must be ordered after the allocation
  const uint64_t used = pool_used();
  gate& user_busy = block(app);
  fill_async(app, data(a), kBytes, 0x44);
  EXPECT_OK(arcpool_record_use(a, app));
  EXPECT_EQ(1u, stats().fences_taken) << "fenced now: app may be gone at deallocation";
  EXPECT_OK(arcpool_deallocate_async(a, origin_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  auto app_after = mark(app);  // nothing of arcpool's may be queued on app after the record
  run_unheld({origin_, other_, third_});
  expect_pending(1, kBytes, 0);  // freed before the unregistered user's work, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  user_busy.open();
  sync(app);
  EXPECT_TRUE(app_after->reached());
  sync(origin_);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
  arcpool_allocation_release(a);
}

/// PyTorch's record_stream semantics: the caller guarantees the stream outlives the
/// deallocation, so its work queued after the record and before the deallocation is covered. A
/// plain record of the same stream later (another component's) takes back no promise: the use is
/// still fenced at deallocation, not by a fence taken at the plain record, which would leave out
/// the work queued on the stream after it.
TEST_P(Ordering, AUseThatOutlivesTheDeallocationIsFencedAtDeallocation) {
  for (const bool plain_record_after : {false, true}) {
    SCOPED_TRACE(plain_record_after ? "a plain record after it" : "alone");
    arcpool_stream_t app = make_app_stream();  // unregistered, as PyTorch's streams are
    arcpool_allocation_t* a = allocate(kBytes, origin_);
    sync(origin_);  // a use on another stream must be ordered after the allocation
    const arcpool_stats_t before = stats();
    EXPECT_OK(arcpool_record_use_with_flags(a, app,
                                            ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION));
    if (plain_record_after) {
      EXPECT_OK(arcpool_record_use(a, app));
      EXPECT_EQ(before.use_records + 2, stats().use_records);
    }
    EXPECT_EQ(before.fences_taken, stats().fences_taken) << "the fence waits for the deallocation";
    gate& user_busy = block(app);
    fill_async(app, data(a), kBytes, 0x45);  // queued after the records, before the deallocation
    EXPECT_OK(arcpool_deallocate_async(a, origin_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
    auto after_free = mark(origin_);
    settle(origin_);
    EXPECT_FALSE(after_free->reached()) << "freed before the side stream's later work";
    user_busy.open();
    sync(origin_);
    EXPECT_TRUE(after_free->reached());
    EXPECT_EQ(before.frees + 1, stats().frees);
    EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_record_use_with_flags(a, app, 1u << 7))
        << "an unknown flag";
    arcpool_allocation_release(a);
  }
}

TEST_P(Ordering, DefaultRoutingWithUseRecordsDefersWithoutFalseDependency) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_record_use(a, third_));
  gate& user_busy = block(third_);
  EXPECT_OK(arcpool_deallocate_async(a, origin_, 0));
  auto origin_after = mark(origin_);
  settle(origin_);
  EXPECT_TRUE(origin_after->reached()) << "the origin does not wait on the user";
  run_unheld({origin_, other_});
  expect_pending(1, kBytes, 0);  // freed before the recorded user's work, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  EXPECT_EQ(1u, stats().deferred_frees);
  user_busy.open();
  sync(third_);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
  arcpool_allocation_release(a);
}

TEST_P(Ordering, ImplicitFreeOfALeakedOwnerIsStreamOrdered) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  EXPECT_OK(arcpool_transfer(a, other_));
  gate& current_busy = block(other_);
  fill_async(other_, data(a), kBytes, 0x55);
  const uint64_t used = pool_used();
  arcpool_allocation_release(a);  // never deallocated: the last reference frees it
  EXPECT_EQ(1u, stats().implicit_frees);
  run_unheld({origin_, third_});
  expect_pending(1, kBytes, 0);  // freed before the current stream's work, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  current_busy.open();
  sync(other_);
  finish_reclaims();
  sync(origin_);  // the free was routed to the origin
  EXPECT_EQ(1u, stats().frees);
  if (on_host()) {
    EXPECT_LT(pool_used(), used);
  }
}

TEST_P(Ordering, ImplicitFreeOnTheOriginStreamFreesInItsOrder) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  gate& busy = block(origin_);
  fill_async(origin_, data(a), kBytes, 0x66);
  const uint64_t used = pool_used();
  arcpool_allocation_release(a);
  auto after = mark(origin_);
  settle(origin_);
  EXPECT_FALSE(after->reached());
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  busy.open();
  sync(origin_);
  EXPECT_EQ(1u, stats().same_stream_frees);
  EXPECT_EQ(1u, stats().implicit_frees);
}

TEST_P(Ordering, ACallersStreamIsFencedEvenWhenItIsNotTheCurrentStream) {
  // Work the caller queued on its own stream before deallocating is covered (deferred route).
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  sync(origin_);  // a use on another stream must be ordered after the allocation
  const uint64_t used = pool_used();
  gate& caller_busy = block(third_);
  fill_async(third_, data(a), kBytes, 0x77);
  EXPECT_OK(arcpool_deallocate_async(a, third_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  run_unheld({origin_, other_});
  expect_pending(1, kBytes, 0);  // freed before the caller's work, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  caller_busy.open();
  sync(third_);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
  arcpool_allocation_release(a);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(Ordering);

}  // namespace
}  // namespace arcpool::test
