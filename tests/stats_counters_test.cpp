// design.md §11: every counter of arcpool_stats_t moves when its event happens, and only then
// (issue 9). Table-driven over ARCPOOL_STATS_COUNTERS: one row per counter, an action that must
// move it, and every counter the action moves with the exact amount; all other counters must
// stay put. A counter added to the list without a row fails EveryCounterHasARow.
//
// Each row: a setup (not measured, leaving nothing running that could move a counter), the
// action, then everything the action started is let run to completion (streams synchronized,
// deferred frees completed) before the counters are read, so the figures are exact on every
// driver; then a cleanup (not measured) that leaves no cached block and no limit behind.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/driver_test.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace arcpool::test {
namespace {

constexpr size_t kSmall = 4096;           // the fast path caches it
constexpr size_t kBig = size_t{2} << 20;  // above the cache's largest block

using counts = std::map<std::string, uint64_t>;

/// The counters of `s`, by name, from the list that defines them.
counts counters_of(const arcpool_stats_t& s) {
  counts c;
#define ARCPOOL_TEST_COUNTER_(name, doc) c[#name] = s.name;
  ARCPOOL_STATS_COUNTERS(ARCPOOL_TEST_COUNTER_)
#undef ARCPOOL_TEST_COUNTER_
  return c;
}

/// Every counter's name, from the list.
std::set<std::string> counter_names() {
  std::set<std::string> names;
#define ARCPOOL_TEST_COUNTER_NAME_(name, doc) names.insert(#name);
  ARCPOOL_STATS_COUNTERS(ARCPOOL_TEST_COUNTER_NAME_)
#undef ARCPOOL_TEST_COUNTER_NAME_
  return names;
}

class StatsCounters : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.stream_cache_bytes = size_t{1} << 20;  // the fast path on: its counters too
    options.stream_cache_max_block = size_t{1} << 20;
  }
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    s_ = make_stream();
    t_ = make_stream();
    app_ = make_app_stream();
  }

  /// One row of the table.
  struct row {
    const char* counter;           ///< the counter the row is for
    std::function<void()> setup;   ///< not measured
    std::function<void()> action;  ///< measured, with everything it started
    counts moves;                  ///< every counter the action moves, and by how much
    std::function<void()> cleanup = [] {};
    bool quiesce = true;  ///< false: the action leaves a stream capturing (not synchronized)
  };

  /// Lets everything run and completes the deferred frees.
  void quiesce() {
    sync(s_);
    sync(t_);
    sync(app_);
    finish_reclaims();
  }

  arcpool_allocation_t* alloc(size_t bytes, arcpool_stream_t s, uint32_t flags = 0) {
    return allocate(bytes, s, flags);
  }
  void release(arcpool_allocation_t*& a) {
    if (a != nullptr) arcpool_allocation_release(a);
    a = nullptr;
  }

  std::vector<row> table();

  arcpool_stream_t s_ = nullptr;
  arcpool_stream_t t_ = nullptr;
  arcpool_stream_t app_ = nullptr;
  // The rows' state.
  arcpool_allocation_t* a_ = nullptr;
  arcpool_allocation_t* b_ = nullptr;
  gate* gate_ = nullptr;
  void* raw_ = nullptr;
};

std::vector<StatsCounters::row> StatsCounters::table() {
  auto dealloc = [](arcpool_allocation_t* a, arcpool_stream_t s, uint32_t flags) {
    EXPECT_OK(arcpool_deallocate_async(a, s, flags));
  };
  // Frees whatever a row left live and unowned (not measured).
  auto free_a = [this, dealloc] {
    if (a_ != nullptr && info(a_).state == ARCPOOL_ALLOCATION_LIVE) dealloc(a_, s_, 0);
    release(a_);
  };
  return {
      {"allocations", [] {}, [this] { a_ = alloc(kBig, s_); }, {{"allocations", 1}}, free_a},
      {"deallocations",
       [this] { a_ = alloc(0, s_); },
       [&, dealloc] { dealloc(a_, s_, 0); },
       {{"deallocations", 1}},  // zero bytes: nothing to give back
       free_a},
      {"frees",
       [this, dealloc] {  // a deferred free held by a gate on the freeing stream
         a_ = alloc(kBig, s_);
         gate_ = &block(t_);
         dealloc(a_, t_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED);
       },
       [this] { gate_->open(); },
       {{"frees", 1}, {"origin_routed_frees", 1}},
       free_a},
      {"cache_hits",
       [this, dealloc] {
         a_ = alloc(kSmall, s_);
         dealloc(a_, s_, 0);
         release(a_);
       },
       [this] { a_ = alloc(kSmall, s_); },
       {{"allocations", 1}, {"cache_hits", 1}},
       free_a},
      {"cache_frees",
       [this] { a_ = alloc(kSmall, s_); },
       [&, dealloc] { dealloc(a_, s_, 0); },
       {{"deallocations", 1}, {"cache_frees", 1}, {"same_stream_frees", 1}},
       free_a},
      {"cache_flushes",
       [this, dealloc] {
         a_ = alloc(kSmall, s_);
         dealloc(a_, s_, 0);
         release(a_);
       },
       [this] { EXPECT_OK(arcpool_allocator_trim(alloc_, 0)); },
       {{"cache_flushes", 1}, {"frees", 1}}},
      {"same_stream_frees",
       [this] { a_ = alloc(kBig, s_); },
       [&, dealloc] { dealloc(a_, s_, 0); },
       {{"deallocations", 1}, {"frees", 1}, {"same_stream_frees", 1}},
       free_a},
      {"cross_stream_frees",
       [this] { a_ = alloc(kBig, s_); },
       [&, dealloc] { dealloc(a_, t_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE); },
       {{"deallocations", 1}, {"cross_stream_frees", 1}, {"fences_taken", 1}, {"frees", 1}},
       free_a},
      {"origin_routed_frees",
       [this] { a_ = alloc(kBig, s_); },
       [&, dealloc] { dealloc(a_, t_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN); },
       {{"deallocations", 1},
        {"cross_stream_frees", 1},
        {"origin_routed_frees", 1},
        {"fences_taken", 1},
        {"frees", 1}},
       free_a},
      {"origin_fallbacks",
       [this] { a_ = alloc(kBig, app_); },  // unregistered origin
       [&, dealloc] { dealloc(a_, t_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN); },
       {{"deallocations", 1},
        {"cross_stream_frees", 1},
        {"origin_fallbacks", 1},
        {"fences_taken", 1},
        {"frees", 1}},
       free_a},
      {"deferred_frees",
       [this] { a_ = alloc(kBig, s_); },
       [&, dealloc] { dealloc(a_, t_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED); },
       {{"deallocations", 1},
        {"cross_stream_frees", 1},
        {"deferred_frees", 1},
        {"fences_taken", 2},  // the caller and the current stream
        {"frees", 1},
        {"origin_routed_frees", 1}},
       free_a},
      {"transfers",
       [this] { a_ = alloc(kBig, s_); },
       [this] { EXPECT_OK(arcpool_transfer(a_, t_)); },
       {{"transfers", 1}, {"fences_taken", 1}},
       free_a},
      {"use_records",
       [this] { a_ = alloc(kBig, s_); },  // a created stream: fenced later
       [this] { EXPECT_OK(arcpool_record_use(a_, t_)); },
       {{"use_records", 1}},
       free_a},
      {"fences_taken",
       [this] {
         a_ = alloc(kBig, s_);
         sync(s_);
       },
       [this] { EXPECT_OK(arcpool_record_use(a_, app_)); },  // unregistered: fenced now
       {{"use_records", 1}, {"fences_taken", 1}},
       free_a},
      {"ignored_deallocations",
       [this] { a_ = alloc(kBig, s_, ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME); },
       [&, dealloc] { dealloc(a_, s_, 0); },
       {{"deallocations", 1}, {"ignored_deallocations", 1}, {"fences_taken", 1}},
       free_a},
      {"implicit_frees",
       [this] { a_ = alloc(kBig, s_); },
       [this] { release(a_); },
       {{"implicit_frees", 1}, {"same_stream_frees", 1}, {"frees", 1}}},
      {"imports",
       [this] { EXPECT_OK(core().drv().pool_allocate(kBig, s_, &raw_)); },
       [this] {
         EXPECT_OK(arcpool_import(alloc_, raw_, kBig, s_, 0, nullptr, nullptr, &a_));  // borrows
       },
       {{"imports", 1}},
       [this] {
         release(a_);
         EXPECT_OK(core().drv().pool_free(raw_, kBig, s_));
       }},
      {"exports",
       [this] { a_ = alloc(kBig, s_); },
       [this] { EXPECT_OK(arcpool_allocation_export(a_, &raw_)); },
       {{"exports", 1}},
       [this] {
         free_exported(raw_, kBig, s_);
         release(a_);
       }},
      {"oom_retries",
       [this, dealloc] {  // a hard limit the cached block fills: only a flush makes room
         EXPECT_OK(arcpool_allocator_set_hard_limit(alloc_, 2 * kSmall));
         a_ = alloc(kSmall, s_);
         dealloc(a_, s_, 0);
         release(a_);
       },
       [this] { a_ = alloc(2 * kSmall, t_); },
       {{"oom_retries", 1}, {"cache_flushes", 1}, {"frees", 1}, {"allocations", 1}},
       [this, dealloc] {
         dealloc(a_, t_, 0);
         release(a_);
         EXPECT_OK(arcpool_allocator_set_hard_limit(alloc_, 0));
       }},
      {"oom_failures",
       [] {},
       [this] {
         EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                       arcpool_allocate_async(alloc_, size_t{1} << 50, 0, s_, 0, &b_));
       },
       {{"oom_retries", 1}, {"oom_failures", 1}}},
      // Last: its block is lost with the failed implicit free (held bytes stay counted).
      {"reclaim_failures",
       [this] {
         {
#if defined(__SANITIZE_ADDRESS__)
           __lsan::ScopedDisabler leaks_expected;  // the failed free loses the block
#endif
           a_ = alloc(kBig, app_);
         }
         ASSERT_OK(core().drv().stream_begin_capture(app_));
       },
       // The implicit free cannot touch a capturing stream; on the CUDA driver, which defers
       // such frees to the graph's end, not one arcpool cannot prove alive then (docs/graphs.md).
       [this] { release(a_); },
       {{"reclaim_failures", 1}},
       [this] { core().drv().stream_end_capture(app_); },
       /*quiesce=*/false},
  };
}

TEST_P(StatsCounters, EveryCounterHasARow) {
  std::set<std::string> rows;
  for (const row& r : table()) {
    EXPECT_TRUE(rows.insert(r.counter).second) << "two rows for " << r.counter;
    EXPECT_EQ(1u, counter_names().count(r.counter)) << r.counter << " is not a counter";
    EXPECT_NE(0u, r.moves.count(r.counter)) << "the row for " << r.counter << " does not move it";
  }
  for (const std::string& name : counter_names())
    EXPECT_EQ(1u, rows.count(name)) << "no row moves " << name;
}

TEST_P(StatsCounters, EachActionMovesExactlyItsCounters) {
  for (row& r : table()) {
    SCOPED_TRACE(r.counter);
    r.setup();  // leaves nothing running that would move a counter (the frees row's held)
    if (HasFatalFailure()) return;
    const counts before = counters_of(stats());
    r.action();
    if (r.quiesce) quiesce();
    const counts after = counters_of(stats());
    for (const auto& [name, value] : after) {
      const auto expected = r.moves.count(name) ? r.moves.at(name) : 0;
      EXPECT_EQ(expected, value - before.at(name))
          << r.counter << "'s action moved " << name << " by " << value - before.at(name)
          << " (expected " << expected << ")";
    }
    r.cleanup();
    quiesce();
    EXPECT_OK(arcpool_allocator_trim(alloc_, 0));  // no cached block for the next row
  }
}

// bytes_held counts what was taken from the pool: a request the pool refuses was never held, so
// its peak stays where it was, with or without a hard limit (which reserves the bytes before the
// pool's call).
TEST_P(StatsCounters, ARequestThePoolRefusesRaisesNoHeldPeak) {
  a_ = alloc(kBig, s_);
  const uint64_t peak = stats().bytes_held_peak;
  EXPECT_LE(kBig, peak);
  for (size_t limit : {size_t{0}, SIZE_MAX}) {
    SCOPED_TRACE(limit);
    EXPECT_OK(arcpool_allocator_set_hard_limit(alloc_, limit));
    EXPECT_STATUS(ARCPOOL_STATUS_OUT_OF_MEMORY,
                  arcpool_allocate_async(alloc_, size_t{1} << 50, 0, s_, 0, &b_));
    const arcpool_stats_t st = stats();
    EXPECT_EQ(peak, st.bytes_held_peak) << "the refused request raised the peak";
    EXPECT_EQ(1u, st.allocations_in_use_current);
  }
  EXPECT_OK(arcpool_allocator_set_hard_limit(alloc_, 0));
  EXPECT_OK(arcpool_deallocate_async(a_, s_, 0));
  release(a_);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(StatsCounters);

}  // namespace
}  // namespace arcpool::test
