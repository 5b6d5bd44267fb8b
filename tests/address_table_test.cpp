// The by-pointer map's table (src/support/address_table.hpp): exact starts, interior addresses,
// growth and backward-shift erasure, checked against an ordered map.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>

#include "support/address_table.hpp"

namespace arcpool::detail {
namespace {

struct tag {
  int n;
};

using table = address_table<tag>;

TEST(AddressTable, ExactAndInteriorAddressesFindTheirRangeAndOthersDoNot) {
  table t;
  tag a{1}, b{2};
  ASSERT_TRUE(t.insert(0x10000, 0x1000, &a));
  ASSERT_TRUE(t.insert(0x20000, 0x100, &b));
  EXPECT_EQ(&a, t.value_at(t.locate(0x10000)));
  EXPECT_EQ(&a, t.value_at(t.locate(0x10fff))) << "the last byte is inside";
  EXPECT_EQ(&b, t.value_at(t.locate(0x20080)));
  EXPECT_EQ(table::npos, t.locate(0x11000)) << "one past the end is outside";
  EXPECT_EQ(table::npos, t.locate(0xffff));
  EXPECT_EQ(table::npos, t.locate(0));
  EXPECT_EQ(2u, t.size());
}

TEST(AddressTable, InsertingAPresentStartReplacesItsEntry) {
  table t;
  tag a{1}, b{2};
  ASSERT_TRUE(t.insert(0x4000, 64, &a));
  ASSERT_TRUE(t.insert(0x4000, 128, &b));
  EXPECT_EQ(1u, t.size());
  EXPECT_EQ(&b, t.value_at(t.locate(0x4000 + 100)));
}

/// Random inserts and erasures (exact and interior), far past several growths, with starts
/// that collide on purpose (many share their low bits, as aligned device addresses do): every
/// lookup agrees with an ordered map of the same ranges.
TEST(AddressTable, AgreesWithAnOrderedMapThroughGrowthAndErasure) {
  table t;
  std::map<uintptr_t, std::pair<size_t, tag*>> reference;
  static tag values[64];
  std::mt19937_64 rng(7);
  auto lookup = [&](uintptr_t address) -> tag* {
    auto it = reference.upper_bound(address);
    if (it == reference.begin()) return nullptr;
    --it;
    return address - it->first < it->second.first ? it->second.second : nullptr;
  };
  auto located = [&](uintptr_t address) -> tag* {
    const size_t i = t.locate(address);
    return i == table::npos ? nullptr : t.value_at(i);
  };
  for (int step = 0; step < 20000; ++step) {
    // Starts on a 4 KiB grid of 4096 places, ranges of at most 4 KiB: never overlapping.
    const uintptr_t start = (1 + rng() % 4096) << 12;
    if (rng() % 3 != 0) {
      if (reference.count(start) != 0) continue;
      tag* v = &values[rng() % 64];
      const size_t size = 1 + rng() % 4096;
      ASSERT_TRUE(t.insert(start, size, v));
      reference[start] = {size, v};
    } else {
      const uintptr_t address = start + rng() % 4096;
      tag* expected = lookup(address);
      ASSERT_EQ(expected, located(address)) << "step " << step;
      if (expected == nullptr) continue;
      reference.erase(std::prev(reference.upper_bound(address)));
      t.erase(t.locate(address));
    }
    ASSERT_EQ(reference.size(), t.size());
    if (step % 64 == 0) {
      // Every start by its probe sequence alone: no erasure left a gap before it.
      for (const auto& [present, entry] : reference) {
        const size_t i = t.find_start(present);
        ASSERT_NE(table::npos, i) << "step " << step;
        ASSERT_EQ(entry.second, t.value_at(i));
      }
    }
  }
  for (const auto& [start, entry] : reference) {
    ASSERT_EQ(entry.second, located(start));
    ASSERT_EQ(entry.second, located(start + entry.first - 1));
  }
}

}  // namespace
}  // namespace arcpool::detail
