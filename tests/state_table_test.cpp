// One test per cell of design.md §3's state table, on both drivers.
#include <gtest/gtest.h>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

class StateTable : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = make_stream();
  }

  /// Owner count and state, unchanged by a refused call.
  void expect_unchanged(arcpool_allocation_t* a, arcpool_allocation_state_t state,
                        uint32_t owners) {
    const auto i = info(a);
    EXPECT_EQ(state, i.state);
    EXPECT_EQ(owners, i.owners);
  }

  arcpool_stream_t s_ = nullptr;
};

// --- preserve ------------------------------------------------------------------------------

TEST_P(StateTable, PreserveLiveAddsAnOwner) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  EXPECT_OK(arcpool_allocation_preserve(a));
  expect_unchanged(a, ARCPOOL_ALLOCATION_LIVE, 2);
  EXPECT_OK(arcpool_allocation_preserve(a));
  expect_unchanged(a, ARCPOOL_ALLOCATION_LIVE, 3);
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_FORCE));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, PreserveUnownedIsNotOwnerAndNeverResurrects) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_allocation_preserve(a));
  expect_unchanged(a, ARCPOOL_ALLOCATION_UNOWNED, 0);
  EXPECT_NE(std::string(arcpool_last_error()).find("allocation #"), std::string::npos)
      << "the message names the allocation: " << arcpool_last_error();
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, PreserveDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_preserve(a));
  expect_unchanged(a, ARCPOOL_ALLOCATION_DEALLOCATED, 0);
  arcpool_allocation_release(a);
}

TEST_P(StateTable, PreserveExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_preserve(a));
  expect_unchanged(a, ARCPOOL_ALLOCATION_EXPORTED, 0);
  arcpool_allocation_release(a);
}

// --- discard -------------------------------------------------------------------------------

TEST_P(StateTable, DiscardLiveRemovesAnOwnerAndReportsTheLast) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_, /*owners=*/2);
  int last = -1;
  EXPECT_OK(arcpool_allocation_discard(a, &last));
  EXPECT_EQ(0, last);
  expect_unchanged(a, ARCPOOL_ALLOCATION_LIVE, 1);
  EXPECT_OK(arcpool_allocation_discard(a, &last));
  EXPECT_EQ(1, last);
  expect_unchanged(a, ARCPOOL_ALLOCATION_UNOWNED, 0);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DiscardUnownedIsNotOwnerAndNeverWraps) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  int last = -1;
  EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_allocation_discard(a, &last));
  EXPECT_EQ(-1, last) << "a refused discard writes nothing";
  expect_unchanged(a, ARCPOOL_ALLOCATION_UNOWNED, 0);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DiscardDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_discard(a, nullptr));
  expect_unchanged(a, ARCPOOL_ALLOCATION_DEALLOCATED, 0);
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DiscardExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_discard(a, nullptr));
  expect_unchanged(a, ARCPOOL_ALLOCATION_EXPORTED, 0);
  arcpool_allocation_release(a);
}

// --- is_terminal ---------------------------------------------------------------------------

TEST_P(StateTable, IsTerminalLiveIsTrueOnlyForTheSoleOwner) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  EXPECT_EQ(1, arcpool_allocation_is_terminal(a));
  EXPECT_OK(arcpool_allocation_preserve(a));
  EXPECT_EQ(0, arcpool_allocation_is_terminal(a));
  EXPECT_OK(arcpool_allocation_discard(a, nullptr));
  EXPECT_EQ(1, arcpool_allocation_is_terminal(a));
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, IsTerminalUnownedIsFalse) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  EXPECT_EQ(0, arcpool_allocation_is_terminal(a));
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, IsTerminalDeallocatedIsFalse) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  EXPECT_EQ(0, arcpool_allocation_is_terminal(a));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, IsTerminalExportedIsFalse) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  EXPECT_EQ(0, arcpool_allocation_is_terminal(a));
  arcpool_allocation_release(a);
}

// --- deallocate ----------------------------------------------------------------------------

TEST_P(StateTable, DeallocateLiveSoleOwnerConsumesTheClaim) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  expect_unchanged(a, ARCPOOL_ALLOCATION_DEALLOCATED, 0);
  sync(s_);
  EXPECT_EQ(1u, stats().frees);
  if (on_host()) {
    EXPECT_LT(pool_used(), used);
  }
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DeallocateLiveWithOtherOwnersIsNotOwner) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_, /*owners=*/2);
  EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_deallocate_async(a, s_, 0));
  expect_unchanged(a, ARCPOOL_ALLOCATION_LIVE, 2);
  EXPECT_EQ(0u, stats().deallocations);
  EXPECT_OK(arcpool_allocation_discard(a, nullptr));
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DeallocateLiveWithOtherOwnersForceDeallocates) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_, /*owners=*/3);
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_FORCE));
  expect_unchanged(a, ARCPOOL_ALLOCATION_DEALLOCATED, 0);
  // The other owners' later calls get ALREADY_DEALLOCATED.
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_discard(a, nullptr));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DeallocateUnownedDeallocates) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  expect_unchanged(a, ARCPOOL_ALLOCATION_DEALLOCATED, 0);
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DeallocateDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_deallocate_async(a, s_, 0));
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED,
                arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_FORCE));
  sync(s_);
  EXPECT_EQ(1u, stats().frees) << "freed exactly once";
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DeallocateExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_deallocate_async(a, s_, 0));
  EXPECT_EQ(0u, stats().frees);
  arcpool_allocation_release(a);
}

// --- transfer, record_use, data, views -----------------------------------------------------

TEST_P(StateTable, TransferLiveMovesTheCurrentStream) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  arcpool_stream_t to = make_stream();
  EXPECT_OK(arcpool_transfer(a, to));
  EXPECT_EQ(to, info(a).current_stream);
  EXPECT_OK(arcpool_deallocate_async(a, to, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, TransferUnownedIsAllowed) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  arcpool_stream_t to = make_stream();
  EXPECT_OK(arcpool_transfer(a, to));
  EXPECT_EQ(to, info(a).current_stream);
  EXPECT_OK(arcpool_deallocate_async(a, to, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, TransferDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_transfer(a, make_stream()));
  EXPECT_EQ(s_, info(a).current_stream);
  arcpool_allocation_release(a);
}

TEST_P(StateTable, TransferExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_transfer(a, make_stream()));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, RecordUseLiveAddsARecord) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  EXPECT_OK(arcpool_record_use(a, make_stream()));
  EXPECT_EQ(1u, info(a).use_records);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, RecordUseUnownedIsAllowed) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  EXPECT_OK(arcpool_record_use(a, make_stream()));
  EXPECT_EQ(1u, info(a).use_records);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, RecordUseDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_record_use(a, make_stream()));
  EXPECT_EQ(0u, info(a).use_records);
  arcpool_allocation_release(a);
}

TEST_P(StateTable, RecordUseExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_record_use(a, make_stream()));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DataLiveAndUnownedIsTheMemory) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  void* p = nullptr;
  EXPECT_OK(arcpool_allocation_data(a, &p));
  EXPECT_NE(nullptr, p);
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p) % ARCPOOL_DEFAULT_ALIGNMENT);
  EXPECT_OK(arcpool_allocation_discard(a, nullptr));
  void* q = nullptr;
  EXPECT_OK(arcpool_allocation_data(a, &q));
  EXPECT_EQ(p, q);
  EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DataDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  void* p = reinterpret_cast<void*>(0x1);
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_data(a, &p));
  EXPECT_EQ(reinterpret_cast<void*>(0x1), p) << "nothing written on failure";
  arcpool_allocation_release(a);
}

TEST_P(StateTable, DataExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_data(a, &p));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, ViewLiveAndUnownedIsAllowed) {
  for (auto state : {ARCPOOL_ALLOCATION_LIVE, ARCPOOL_ALLOCATION_UNOWNED}) {
    auto* a = make_in_state(state, s_);
    arcpool_allocation_t* v = nullptr;
    EXPECT_OK(arcpool_allocation_view(a, 256, 512, &v));
    EXPECT_EQ(512u, arcpool_allocation_size(v));
    arcpool_allocation_release(v);
    EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
    arcpool_allocation_release(a);
  }
}

TEST_P(StateTable, ViewDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  arcpool_allocation_t* v = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_view(a, 0, 16, &v));
  EXPECT_EQ(nullptr, v);
  arcpool_allocation_release(a);
}

TEST_P(StateTable, ViewExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  arcpool_allocation_t* v = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_view(a, 0, 16, &v));
  arcpool_allocation_release(a);
}

// --- export --------------------------------------------------------------------------------

TEST_P(StateTable, ExportLiveSoleOwnerHandsOutThePointer) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  void* data = nullptr;
  EXPECT_OK(arcpool_allocation_data(a, &data));
  void* p = nullptr;
  EXPECT_OK(arcpool_allocation_export(a, &p));
  EXPECT_EQ(data, p);
  expect_unchanged(a, ARCPOOL_ALLOCATION_EXPORTED, 0);
  arcpool_allocation_release(a);  // R = 0: the record goes, the memory stays
  sync(s_);
  EXPECT_EQ(0u, stats().frees);
  EXPECT_EQ(0u, stats().implicit_frees);
  free_exported(p, 4096, s_);
}

TEST_P(StateTable, ExportLiveWithOtherOwnersIsNotOwner) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_, /*owners=*/2);
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_NOT_OWNER, arcpool_allocation_export(a, &p));
  EXPECT_EQ(nullptr, p);
  expect_unchanged(a, ARCPOOL_ALLOCATION_LIVE, 2);
  EXPECT_OK(arcpool_deallocate_async(a, s_, ARCPOOL_DEALLOCATE_FLAG_FORCE));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, ExportUnownedExports) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  void* p = nullptr;
  EXPECT_OK(arcpool_allocation_export(a, &p));
  expect_unchanged(a, ARCPOOL_ALLOCATION_EXPORTED, 0);
  arcpool_allocation_release(a);
  free_exported(p, 4096, s_);
}

TEST_P(StateTable, ExportDeallocatedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_export(a, &p));
  arcpool_allocation_release(a);
}

TEST_P(StateTable, ExportExportedIsAlreadyDeallocated) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  void* p = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_ALREADY_DEALLOCATED, arcpool_allocation_export(a, &p));
  arcpool_allocation_release(a);
}

// --- retain / release and R = 0 ------------------------------------------------------------

TEST_P(StateTable, RetainReleaseCountReferencesInEveryState) {
  for (auto state : {ARCPOOL_ALLOCATION_LIVE, ARCPOOL_ALLOCATION_UNOWNED,
                     ARCPOOL_ALLOCATION_DEALLOCATED, ARCPOOL_ALLOCATION_EXPORTED}) {
    auto* a = make_in_state(state, s_);
    EXPECT_EQ(1u, info(a).references);
    EXPECT_OK(arcpool_allocation_retain(a));
    EXPECT_EQ(2u, info(a).references);
    EXPECT_EQ(state, info(a).state) << "references never change ownership";
    EXPECT_OK(arcpool_allocation_release(a));
    EXPECT_EQ(1u, info(a).references);
    if (state == ARCPOOL_ALLOCATION_LIVE || state == ARCPOOL_ALLOCATION_UNOWNED) {
      EXPECT_OK(arcpool_deallocate_async(a, s_, 0));
    }
    arcpool_allocation_release(a);
  }
}

TEST_P(StateTable, LastReleaseOfDeallocatedFreesOnlyTheRecord) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_DEALLOCATED, s_);
  arcpool_allocation_release(a);
  sync(s_);
  const auto st = stats();
  EXPECT_EQ(1u, st.frees);
  EXPECT_EQ(0u, st.implicit_frees);
  EXPECT_EQ(0u, st.allocations_in_use_current);
}

TEST_P(StateTable, LastReleaseOfLiveIsAnImplicitFree) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_LIVE, s_);
  arcpool_allocation_release(a);  // a leaked owner
  sync(s_);
  const auto st = stats();
  EXPECT_EQ(1u, st.implicit_frees);
  EXPECT_EQ(1u, st.frees);
  EXPECT_EQ(0u, st.bytes_in_use_current);
  if (on_host()) {
    EXPECT_EQ(0u, pool_used());
  }
}

TEST_P(StateTable, LastReleaseOfUnownedIsAnImplicitFree) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_UNOWNED, s_);
  arcpool_allocation_release(a);
  sync(s_);
  EXPECT_EQ(1u, stats().implicit_frees);
  EXPECT_EQ(1u, stats().frees);
}

TEST_P(StateTable, LastReleaseOfExportedFreesNothing) {
  auto* a = make_in_state(ARCPOOL_ALLOCATION_EXPORTED, s_);
  const uint64_t used = pool_used();
  arcpool_allocation_release(a);
  sync(s_);
  EXPECT_EQ(0u, stats().frees);
  EXPECT_EQ(0u, stats().implicit_frees);
  if (on_host()) {
    EXPECT_EQ(used, pool_used()) << "the exported memory is the caller's";
  }
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(StateTable);

}  // namespace
}  // namespace arcpool::test
