// design.md §4: a free is ordered after the work queued on the caller's stream, also when the
// caller is neither the origin nor the current stream, on every route (wait-and-free,
// prefer-origin eager and its fallback, deferred with the origin alive or not, the reclaim path
// of a retired current stream) and for imported and indeterminate-lifetime memory (issue 9).
//
// Each test: an allocation made on the origin, handed to the current stream, then written by the
// caller behind a gate; the caller deallocates. Every other stream (and one reclaim pass) then
// runs as far as it can, and no free of the block may have run: a marker queued after each free
// that was enqueued is not reached, nothing deferred has completed, and on the host drivers the
// pool still holds the block (its figure counts executed frees). On the deterministic driver the
// happens-before checker also fails any free not ordered after the caller's write. Then the
// gate opens and the block is freed exactly once, on the stream the route names.
#include <gtest/gtest.h>

#include <atomic>
#include <initializer_list>
#include <optional>
#include <vector>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 256 << 10;

class CallersStream : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    origin_ = make_stream();
    current_ = make_stream();
    caller_ = make_stream();
  }

  /// Hands `a` to current_, then has the caller write it behind a gate (ordered after the
  /// allocation and the transfer: the caller synchronized with the current stream first).
  void use_on_caller(arcpool_allocation_t* a) {
    logged_ = frees_enqueued().size();
    EXPECT_OK(arcpool_transfer(a, current_));
    sync(current_);
    gate_ = &block(caller_);
    fill_async(caller_, data(a), kBytes, 0x6b);
  }

  /// Runs every stream but the held caller as far as it can, with a reclaim pass, then expects
  /// that no free of `mem` ran or can run before the caller's work: each stream a free of it
  /// was enqueued on holds a marker behind it that is not reached, and the pool still holds
  /// `pool_used` bytes (host drivers; nullopt: not checked).
  void expect_not_freed_before_the_callers_work(const void* mem, std::optional<uint64_t> pool_bytes,
                                                std::initializer_list<arcpool_stream_t> more = {}) {
    std::vector<arcpool_stream_t> others{origin_, current_};
    others.insert(others.end(), more.begin(), more.end());
    for (arcpool_stream_t s : others)
      settle(s);
    core().reclaim_poll_once();
    for (arcpool_stream_t s : others)
      settle(s);
    for (arcpool_stream_t s : streams_that_freed(mem, logged_)) {
      auto after_free = mark(s);
      settle(s);
      EXPECT_FALSE(after_free->reached())
          << "the free enqueued on stream " << s << " ran before the caller's work (caller "
          << caller_ << ", origin " << origin_ << ", current " << current_ << ")";
    }
    if (pool_bytes && on_host()) {
      EXPECT_EQ(*pool_bytes, pool_used()) << "the pool got the block back before the caller's work";
    }
  }

  /// Opens the caller's gate, lets everything run, completes the deferred frees, and returns the
  /// streams the frees of `mem` were enqueued on since `logged_` (set by use_on_caller).
  std::vector<arcpool_stream_t> release_the_caller(const void* mem) {
    gate_->open();
    sync(caller_);
    sync(current_);
    sync(origin_);
    finish_reclaims();
    return streams_that_freed(mem, logged_);
  }

  arcpool_stream_t origin_ = nullptr;
  arcpool_stream_t current_ = nullptr;
  arcpool_stream_t caller_ = nullptr;
  gate* gate_ = nullptr;
  size_t logged_ = 0;  ///< frees logged before this round (a pool may reuse the address)
};

TEST_P(CallersStream, WaitAndFreeFreesAfterTheCallersWork) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  void* const mem = data(a);
  use_on_caller(a);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE));
  expect_not_freed_before_the_callers_work(mem, used);
  EXPECT_EQ(std::vector<arcpool_stream_t>{caller_}, release_the_caller(mem));
  EXPECT_EQ(1u, stats().frees);
  arcpool_allocation_release(a);
}

TEST_P(CallersStream, PreferOriginEagerMakesTheOriginWaitForTheCaller) {
  arcpool_allocation_t* a = allocate(kBytes, origin_);
  void* const mem = data(a);
  use_on_caller(a);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, streams_that_freed(mem, logged_))
      << "an origin proven alive frees at once, behind its waits";
  expect_not_freed_before_the_callers_work(mem, used);
  EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, release_the_caller(mem));
  EXPECT_EQ(1u, stats().origin_routed_frees);
  arcpool_allocation_release(a);
}

TEST_P(CallersStream, PreferOriginFallbackFreesAfterTheCallersWork) {
  arcpool_stream_t app = make_app_stream();  // unregistered: not provably alive
  arcpool_allocation_t* a = allocate(kBytes, app);
  void* const mem = data(a);
  use_on_caller(a);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN));
  expect_not_freed_before_the_callers_work(mem, used, {app});
  EXPECT_EQ(std::vector<arcpool_stream_t>{caller_}, release_the_caller(mem));
  EXPECT_EQ(1u, stats().origin_fallbacks);
  arcpool_allocation_release(a);
}

TEST_P(CallersStream, DeferredFreesOnTheOriginAfterTheCallersWork) {
  for (uint32_t flag : {uint32_t{ARCPOOL_DEALLOCATE_FLAG_DEFERRED}, uint32_t{0}}) {
    SCOPED_TRACE(flag == 0 ? "default routing" : "DEFERRED");
    arcpool_allocation_t* a = allocate(kBytes, origin_);
    void* const mem = data(a);
    use_on_caller(a);
    const uint64_t used = pool_used();
    const uint64_t frees = stats().frees;
    EXPECT_OK(arcpool_deallocate_async(a, caller_, flag));
    expect_not_freed_before_the_callers_work(mem, used);
    expect_pending(1, kBytes, frees);
    EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, release_the_caller(mem));
    arcpool_allocation_release(a);
  }
}

TEST_P(CallersStream, DeferredWithTheOriginNotAliveFreesOnTheReclaimStreamAfterTheCaller) {
  arcpool_stream_t app = make_app_stream();
  arcpool_allocation_t* a = allocate(kBytes, app);
  void* const mem = data(a);
  use_on_caller(a);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, caller_, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  expect_not_freed_before_the_callers_work(mem, used, {app});
  expect_pending(1, kBytes, 0);
  const std::vector<arcpool_stream_t> freed = release_the_caller(mem);
  ASSERT_EQ(1u, freed.size());
  for (arcpool_stream_t s : {app, origin_, current_, caller_})
    EXPECT_NE(s, freed[0]) << "the reclaim stream frees";
  arcpool_allocation_release(a);
}

/// The current stream was destroyed since the allocation: whatever routing the caller asks for,
/// the free goes through the reclaim path, and that path fences the caller too.
TEST_P(CallersStream, TheReclaimPathOfARetiredCurrentStreamWaitsForTheCaller) {
  for (uint32_t flag : {uint32_t{ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE},
                        uint32_t{ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN}, uint32_t{0}}) {
    SCOPED_TRACE(flag);
    arcpool_stream_t doomed = nullptr;
    ASSERT_OK(arcpool_stream_create(alloc_, &doomed));
    arcpool_allocation_t* a = allocate(kBytes, origin_);
    void* const mem = data(a);
    EXPECT_OK(arcpool_transfer(a, doomed));
    sync(doomed);
    ASSERT_OK(arcpool_stream_destroy(alloc_, doomed));
    logged_ = frees_enqueued().size();
    gate_ = &block(caller_);
    fill_async(caller_, mem, kBytes, 0x6c);
    const uint64_t used = pool_used();
    const uint64_t deferred = stats().deferred_frees;
    const uint64_t frees = stats().frees;
    EXPECT_OK(arcpool_deallocate_async(a, caller_, flag));
    EXPECT_EQ(deferred + 1, stats().deferred_frees) << "a retired current stream defers";
    expect_not_freed_before_the_callers_work(mem, used);
    expect_pending(1, kBytes, frees);
    EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, release_the_caller(mem));
    arcpool_allocation_release(a);
  }
}

/// Counts on_free calls of a consuming import.
struct on_free_count {
  std::atomic<int> calls{0};
  static void record(void*, size_t, void* user_data) {
    static_cast<on_free_count*>(user_data)->calls.fetch_add(1);
  }
};

TEST_P(CallersStream, AConsumingImportsOnFreeWaitsForTheCaller) {
  void* foreign = nullptr;
  ASSERT_OK(core().drv().pool_allocate(kBytes, origin_, &foreign));
  on_free_count count;
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_import(alloc_, foreign, kBytes, origin_, ARCPOOL_IMPORT_FLAG_CONSUME,
                           &on_free_count::record, &count, &a));
  use_on_caller(a);
  EXPECT_OK(arcpool_deallocate_async(a, caller_, 0));
  expect_not_freed_before_the_callers_work(foreign, std::nullopt);
  expect_pending(1, 0, 0);  // imported bytes are never pending pool bytes
  EXPECT_EQ(0, count.calls.load()) << "on_free before the caller's work";
  release_the_caller(foreign);
  EXPECT_EQ(1, count.calls.load());
  arcpool_allocation_release(a);
  EXPECT_EQ(1, count.calls.load()) << "exactly once";
  EXPECT_OK(core().drv().pool_free(foreign, kBytes, origin_));  // the foreign owner's free
}

TEST_P(CallersStream, IndeterminateMemoryWaitsForTheCallerAfterTheLastReference) {
  arcpool_allocation_t* a =
      allocate(kBytes, origin_, ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
  void* const mem = data(a);
  use_on_caller(a);
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_deallocate_async(a, caller_, 0));  // enqueues nothing: fences only
  EXPECT_EQ(1u, stats().ignored_deallocations);
  arcpool_allocation_release(a);  // the last reference: the memory goes back after the fences
  expect_not_freed_before_the_callers_work(mem, used);
  expect_pending(1, kBytes, 0);
  EXPECT_EQ(std::vector<arcpool_stream_t>{origin_}, release_the_caller(mem));
  EXPECT_EQ(1u, stats().frees);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(CallersStream);

}  // namespace
}  // namespace arcpool::test
