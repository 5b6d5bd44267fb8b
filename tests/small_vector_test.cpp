// The inline-then-heap vector of fence lists (src/support/small_vector.hpp): elements across the
// inline part and the overflow, in order, destroyed exactly once, checked against std::vector.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "support/small_vector.hpp"

namespace arcpool::detail {
namespace {

using list = small_vector<std::shared_ptr<int>, 4>;

std::vector<int> values(const list& v) {
  std::vector<int> out;
  for (const auto& p : v)
    out.push_back(*p);
  return out;
}

TEST(SmallVector, ElementsPastTheInlinePartKeepTheirOrderAndIndex) {
  list v;
  EXPECT_TRUE(v.empty());
  for (int i = 0; i < 9; ++i)
    v.push_back(std::make_shared<int>(i));
  ASSERT_EQ(9u, v.size());
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8}), values(v));
  EXPECT_EQ(5, *v[5]);
  EXPECT_EQ(8, *v.back());
}

TEST(SmallVector, EveryElementIsReleasedOnceByPopClearMoveAndDestruction) {
  auto counted = std::make_shared<int>(7);
  {
    list v;
    for (int i = 0; i < 6; ++i)
      v.push_back(counted);
    EXPECT_EQ(7, counted.use_count());
    v.pop_back();  // from the overflow
    v.pop_back();
    v.pop_back();  // from the inline part
    EXPECT_EQ(4, counted.use_count());
    v.push_back(counted);
    v.push_back(counted);
    list moved(std::move(v));
    EXPECT_TRUE(v.empty());
    EXPECT_EQ(5u, moved.size());
    EXPECT_EQ(6, counted.use_count()) << "a move neither copies nor drops";
    moved.clear();
    EXPECT_EQ(1, counted.use_count());
    moved.push_back(counted);
    for (int i = 0; i < 5; ++i)
      v.push_back(counted);  // a moved-from list is usable
    EXPECT_EQ(7, counted.use_count());
  }
  EXPECT_EQ(1, counted.use_count()) << "destruction releases inline and overflow elements";
}

TEST(SmallVector, AMoveTakesTheElementsPastTheInlinePartWithTheirStorage) {
  // A move is noexcept: building the overflow again would allocate, and end the process when
  // the host has no memory.
  list v;
  for (int i = 0; i < 6; ++i)
    v.push_back(std::make_shared<int>(i));
  const std::shared_ptr<int>* fifth = &v[5];
  list moved(std::move(v));
  EXPECT_EQ(fifth, &moved[5]) << "the move built the elements past the inline part again";
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 4, 5}), values(moved));
  EXPECT_TRUE(v.empty_and_inline());

  list assigned;
  for (int i = 0; i < 7; ++i)
    assigned.push_back(std::make_shared<int>(10 + i));  // its own overflow, dropped by the move
  assigned = std::move(moved);
  EXPECT_EQ(fifth, &assigned[5]);
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 4, 5}), values(assigned));
  EXPECT_TRUE(moved.empty());
}

TEST(SmallVector, PushesUpToTheReservedRoomKeepTheOverflowsStorage) {
  // The reclaim worker pushes into room reserved before: a push there allocates nothing, so
  // the first element past the inline part stays where it is.
  list v;
  v.reserve(3);  // within the inline part: no overflow made
  EXPECT_TRUE(v.empty_and_inline());
  v.reserve(10);
  for (int i = 0; i < 5; ++i)
    v.push_back(std::make_shared<int>(i));
  const std::shared_ptr<int>* fifth = &v[4];
  for (int i = 5; i < 10; ++i)
    v.push_back(std::make_shared<int>(i));
  EXPECT_EQ(fifth, &v[4]) << "a push within the reserved room moved the overflow";
  EXPECT_EQ((std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), values(v));
}

TEST(SmallVector, RandomPushesAndPopsMatchAStdVector) {
  std::mt19937 rng(12345);
  list v;
  std::vector<int> model;
  for (int step = 0; step < 5000; ++step) {
    const unsigned r = rng() % 10;
    if (r < 6 || model.empty()) {
      const int x = static_cast<int>(rng() % 1000);
      v.push_back(std::make_shared<int>(x));
      model.push_back(x);
    } else if (r < 9) {
      v.pop_back();
      model.pop_back();
    } else {
      v.clear();
      model.clear();
    }
    ASSERT_EQ(model.size(), v.size());
    ASSERT_EQ(model, values(v)) << "step " << step;
  }
}

}  // namespace
}  // namespace arcpool::detail
