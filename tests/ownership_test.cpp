// The owner count's limit (design.md §3): preserve refuses the owner past UINT32_MAX and changes
// nothing, since one more would carry into the state bits of the word and turn a LIVE
// allocation with 2^32 - 1 owners into an UNOWNED one with none.
#include <gtest/gtest.h>

#include <cstdint>

#include "core/ownership.hpp"

namespace arcpool::detail {
namespace {

TEST(Ownership, ThePreserveThatWouldOverflowTheOwnerCountIsRefusedAndChangesNothing) {
  ownership o = ownership::live_with_owners(UINT32_MAX - 1);
  EXPECT_EQ(ownership_result::ok, o.preserve());
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, o.load().st);
  EXPECT_EQ(UINT32_MAX, o.load().owners);

  EXPECT_EQ(ownership_result::overflow, o.preserve());
  EXPECT_EQ(ARCPOOL_ALLOCATION_LIVE, o.load().st) << "the state bits took the carry";
  EXPECT_EQ(UINT32_MAX, o.load().owners);

  // Every owner can still let go, and the count comes down by one.
  bool last = true;
  EXPECT_EQ(ownership_result::ok, o.discard(&last));
  EXPECT_FALSE(last);
  EXPECT_EQ(UINT32_MAX - 1, o.load().owners);
  EXPECT_EQ(ownership_result::ok, o.preserve()) << "room for one owner again";
}

TEST(Ownership, AtTheLimitADeallocationStillNeedsForceAndThenTakesEveryClaim) {
  ownership o = ownership::live_with_owners(UINT32_MAX);
  EXPECT_EQ(ownership_result::not_owner, o.can_deallocate(/*force=*/false));
  EXPECT_EQ(ownership_result::ok, o.accept_deallocation(/*force=*/true));
  EXPECT_EQ(ARCPOOL_ALLOCATION_DEALLOCATED, o.load().st);
  EXPECT_EQ(0u, o.load().owners);
  EXPECT_EQ(ownership_result::already_deallocated, o.preserve());
}

}  // namespace
}  // namespace arcpool::detail
