// The raw-pointer entry points frameworks call (PyTorch's pluggable allocator signatures),
// served by the per-device default allocator. On both drivers.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "support/driver_test.hpp"
#include "support/simcuda_probe.hpp"
#include "support/stream_probe.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 1 << 20;

class RawPointer : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_OK(arcpool_default_allocator_set(0, alloc_));
    s_ = make_stream();
  }
  void TearDown() override {
    if (alloc_ != nullptr) {
      EXPECT_OK(arcpool_default_allocator_set(0, nullptr));
    }
    DriverTest::TearDown();
  }

  arcpool_stream_t s_ = nullptr;
};

TEST_P(RawPointer, MallocAndFreeAreStreamOrdered) {
  arcpool_allocator_t* current = nullptr;
  ASSERT_OK(arcpool_default_allocator_get(0, &current));
  EXPECT_EQ(alloc_, current);
  void* p = arcpool_malloc_async(kBytes, 0, s_);
  ASSERT_NE(nullptr, p) << arcpool_last_error();
  EXPECT_EQ(kBytes, stats().bytes_in_use_current);
  fill_async(s_, p, kBytes, 0x3c);
  EXPECT_OK(arcpool_free_async(p, kBytes, 0, s_));
  sync(s_);
  EXPECT_EQ(1u, stats().frees);
  EXPECT_EQ(0u, stats().bytes_in_use_current);
}

TEST_P(RawPointer, InteriorPointersResolveToTheirAllocation) {
  char* p = static_cast<char*>(arcpool_malloc_async(kBytes, 0, s_));
  ASSERT_NE(nullptr, p);
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_free_async(p + kBytes, 0, 0, s_))
      << "one past the end is not inside";
  EXPECT_OK(arcpool_record_stream(p + kBytes / 2, s_));
  EXPECT_OK(arcpool_free_async(p + 100, kBytes, 0, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_free_async(p, kBytes, 0, s_));
}

/// The map is sharded by data pointer: an interior pointer hashes to some other shard than
/// its allocation's, and must still be found, for each of many allocations spread over the
/// shards; exact pointers are found in their own.
TEST_P(RawPointer, EveryAllocationOfManyIsFoundByExactAndInteriorPointers) {
  constexpr size_t kCount = 256;
  constexpr size_t kSmall = 4096;
  std::vector<char*> blocks;
  for (size_t i = 0; i < kCount; ++i) {
    blocks.push_back(static_cast<char*>(arcpool_malloc_async(kSmall, 0, s_)));
    ASSERT_NE(nullptr, blocks.back()) << arcpool_last_error();
  }
  for (size_t i = 0; i < kCount; ++i) {
    EXPECT_OK(arcpool_record_stream(blocks[i], s_)) << "exact pointer of block " << i;
    EXPECT_OK(arcpool_record_stream(blocks[i] + 1 + i % (kSmall - 1), s_))
        << "interior pointer of block " << i;
  }
  // Every other block by its exact pointer, the rest by an interior one.
  for (size_t i = 0; i < kCount; ++i) {
    char* p = i % 2 == 0 ? blocks[i] : blocks[i] + kSmall - 1 - i;
    EXPECT_OK(arcpool_free_async(p, kSmall, 0, s_)) << "block " << i;
  }
  for (char* p : blocks) {
    EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_free_async(p, kSmall, 0, s_))
        << "freed twice";
  }
  sync(s_);
  finish_reclaims();
  EXPECT_EQ(0u, stats().bytes_in_use_current);
}

TEST_P(RawPointer, RecordStreamOrdersTheFreeAfterTheOtherStream) {
  arcpool_stream_t side = make_stream();
  void* p = arcpool_malloc_async(kBytes, 0, s_);
  ASSERT_NE(nullptr, p);
  sync(s_);  // a use on another stream must be ordered after the allocation
  const uint64_t used = pool_used();
  EXPECT_OK(arcpool_record_stream(p, side));  // what Tensor.record_stream does
  gate& busy = block(side);
  fill_async(side, p, kBytes, 0x3d);
  EXPECT_OK(arcpool_free_async(p, kBytes, 0, s_));  // PyTorch frees on the allocation stream
  run_unheld({s_});
  expect_pending(1, kBytes, 0);  // freed while the side stream still writes, if not
  if (on_host()) {
    EXPECT_EQ(used, pool_used());
  }
  busy.open();
  sync(side);
  finish_reclaims();
  EXPECT_EQ(1u, stats().frees);
}

/// The calls PyTorch makes, in its order, with the flag its record_stream hook passes: the free
/// waits for the side stream's work queued before the free, not only before record_stream.
/// (Use records route wait-and-free here, so the wait shows on the freeing stream.)
class RawPointerWaitAndFree : public RawPointer {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    options.use_record_routing = ARCPOOL_ROUTING_WAIT_AND_FREE;
  }
};

TEST_P(RawPointerWaitAndFree, RecordStreamThatOutlivesTheFreeCoversLaterSideWork) {
  arcpool_stream_t side = make_app_stream();  // torch's streams are never registered
  void* p = arcpool_malloc_async(kBytes, 0, s_);
  ASSERT_NE(nullptr, p);
  sync(s_);  // a use on another stream must be ordered after the allocation
  EXPECT_OK(arcpool_record_stream_with_flags(p, side,
                                             ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION));
  gate& busy = block(side);
  fill_async(side, p, kBytes, 0x3e);                // after record_stream, before the free
  EXPECT_OK(arcpool_free_async(p, kBytes, 0, s_));  // PyTorch frees on the allocation stream
  auto after_free = mark(s_);
  settle(s_);
  EXPECT_FALSE(after_free->reached()) << "freed while the side stream still writes";
  busy.open();
  sync(s_);
  EXPECT_TRUE(after_free->reached());
  EXPECT_EQ(1u, stats().frees);
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(RawPointerWaitAndFree);

TEST_P(RawPointer, ZeroBytesIsNullAndFreeingNullIsANoOp) {
  EXPECT_EQ(nullptr, arcpool_malloc_async(0, 0, s_));
  EXPECT_OK(arcpool_free_async(nullptr, 0, 0, s_));
  EXPECT_EQ(0u, stats().allocations);
}

TEST_P(RawPointer, AWrongDeviceIsAnInvalidArgumentAndFreesNothing) {
  void* p = arcpool_malloc_async(kBytes, 0, s_);
  ASSERT_NE(nullptr, p);
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_free_async(p, kBytes, 3, s_));
  // A negative device names none (arcpool_malloc_async refuses it too), never "any device".
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_free_async(p, kBytes, -1, s_));
  EXPECT_EQ(0u, stats().deallocations);
  EXPECT_OK(arcpool_free_async(p, kBytes, 0, s_));
}

TEST_P(RawPointer, AFreeThatFailsAfterItsCommitLeavesNoDeallocatedEntry) {
  // A pool free that fails after the deallocation committed (only a broken context does, on
  // CUDA) loses the block with it; the pointer's entry, deallocated now, must not go back to
  // the map, where every later free of it was refused (ALREADY_DEALLOCATED) and the allocator
  // never emptied.
  if (GetParam().kind != ARCPOOL_DRIVER_CUDA || !on_simcuda()) {
    GTEST_SKIP() << "fails the pool free with simcuda_fail_next";
  }
  void* p = arcpool_malloc_async(kBytes, 0, s_);  // the fixture's caches are off
  ASSERT_NE(nullptr, p);
  ASSERT_TRUE(simcuda_fail_next("cudaFreeAsync", cudaErrorInvalidValue));
  EXPECT_STATUS(ARCPOOL_STATUS_CUDA_ERROR, arcpool_free_async(p, kBytes, 0, s_));
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_free_async(p, kBytes, 0, s_));
  EXPECT_EQ(0u, stats().allocations_in_use_current);
}

TEST_P(RawPointer, RecordStreamOfAnUnknownPointerIsUnknownPointer) {
  int x = 0;
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_record_stream(&x, s_));
}

TEST_P(RawPointer, AllocationsOfAReplacedDefaultStayValid) {
  ARCPOOL_SKIP_ON_DETERMINISTIC("the replacement's own driver cannot name the fixture's streams");
  void* p = arcpool_malloc_async(kBytes, 0, s_);
  ASSERT_NE(nullptr, p);
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = GetParam();
  arcpool_allocator_t* replacement = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &replacement));
  ASSERT_OK(arcpool_default_allocator_set(0, replacement));
  arcpool_allocator_destroy(replacement);  // the default table keeps its own reference
  void* q = arcpool_malloc_async(kBytes, 0, s_);
  ASSERT_NE(nullptr, q);
  EXPECT_EQ(1u, stats().allocations) << "new allocations come from the replacement";
  EXPECT_OK(arcpool_free_async(p, kBytes, 0, s_));
  EXPECT_OK(arcpool_free_async(q, kBytes, 0, s_));
  EXPECT_EQ(1u, stats().deallocations);
}

TEST_P(RawPointer, ReplacingTheDefaultWhileThreadsAllocateLosesNothing) {
  // The raw-pointer entry points find the default allocator without a lock or a reference
  // (api/default_allocators.hpp): a replaced allocator must outlive every malloc that found it.
  // Each replacement here drops the only other reference, so an allocator released too early
  // is used after its destruction (ASan; unmapped memory without it).
  ARCPOOL_SKIP_ON_DETERMINISTIC(
      "threads of its own; the replacement's driver cannot name the "
      "fixture's streams");
  constexpr int kThreads = 4;
  constexpr int kReplacements = 200;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::atomic<long> pairs{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      arcpool_stream_t s = t % 2 == 0 ? s_ : nullptr;  // a created stream and the legacy one
      for (long mine = 1; !done.load(std::memory_order_relaxed); ++mine) {
        void* p = arcpool_malloc_async(4096 * (1 + t), 0, s);
        if (p == nullptr || arcpool_free_async(p, 4096 * (1 + t), 0, s) != ARCPOOL_STATUS_SUCCESS)
          failures.fetch_add(1);
        pairs.fetch_add(1, std::memory_order_relaxed);
        // Now and then let the stream catch up: on simcuda's slow mode (up to 2 ms an operation)
        // the queue otherwise grew for as long as the replacements ran, and the final sync took
        // most of ctest's 120 s on a loaded machine.
        if (mine % 64 == 0) sync(s);
      }
    });
  }
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = GetParam();
  for (int i = 0; i < kReplacements; ++i) {
    arcpool_allocator_t* replacement = nullptr;
    ASSERT_OK(arcpool_allocator_create(&options, &replacement));
    ASSERT_OK(arcpool_default_allocator_set(0, replacement));
    arcpool_allocator_destroy(replacement);  // the table's reference is the only other one
    const long before = pairs.load();
    while (pairs.load() < before + kThreads)
      std::this_thread::yield();  // some use it
  }
  ASSERT_OK(arcpool_default_allocator_set(0, alloc_));
  done = true;
  for (std::thread& t : threads)
    t.join();
  EXPECT_EQ(0, failures.load()) << arcpool_last_error();
  sync(s_);
  sync(nullptr);
}

/// An out-of-memory callback that replaces the default allocator of device 0 with the
/// allocator `user_data` points at, and asks for no retry.
int replace_default_on_oom(size_t, void* user_data) {
  auto* replacement = static_cast<arcpool_allocator_t**>(user_data);
  EXPECT_OK(arcpool_default_allocator_set(0, *replacement));
  return 0;
}

TEST_P(RawPointer, ADefaultReplacedWithinItsOwnMallocServesThatMallocToTheEnd) {
  // The out-of-memory callback of the allocator a malloc found replaces it: the malloc still
  // ends in it (its message reads its figures after the callback), without waiting for
  // itself, and the next malloc goes to the replacement.
  ARCPOOL_SKIP_ON_DETERMINISTIC("the replacement's own driver cannot name the fixture's streams");
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = GetParam();
  arcpool_allocator_t* replacement = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &replacement));
  options.hard_limit_bytes = kBytes;
  options.on_out_of_memory = replace_default_on_oom;
  options.on_out_of_memory_user_data = &replacement;
  arcpool_allocator_t* limited = nullptr;
  ASSERT_OK(arcpool_allocator_create(&options, &limited));
  ASSERT_OK(arcpool_default_allocator_set(0, limited));
  arcpool_allocator_destroy(limited);  // the table's reference is the only one
  EXPECT_EQ(nullptr, arcpool_malloc_async(2 * kBytes, 0, s_)) << "beyond the hard limit";
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "hard limit")) << arcpool_last_error();
  void* p = arcpool_malloc_async(2 * kBytes, 0, s_);
  ASSERT_NE(nullptr, p) << "the replacement has no limit: " << arcpool_last_error();
  arcpool_allocator_t* current = nullptr;
  ASSERT_OK(arcpool_default_allocator_get(0, &current));
  EXPECT_EQ(replacement, current);
  EXPECT_OK(arcpool_free_async(p, 2 * kBytes, 0, s_));
  arcpool_allocator_destroy(replacement);
  sync(s_);
}

TEST_P(RawPointer, ADefaultAllocatorMustServeItsDevice) {
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_default_allocator_set(1, alloc_));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_default_allocator_set(-1, alloc_));
}

TEST_P(RawPointer, FindingADefaultAllocatorNeverCreatesOne) {
  // A query must not create an allocator, and with it a CUDA context, on a device the process
  // never used. Device 0's is the test's; the highest device no test uses has none.
  arcpool_allocator_t* found = nullptr;
  ASSERT_OK(arcpool_default_allocator_find(0, &found));
  EXPECT_EQ(alloc_, found);
  constexpr int kUnused = 1000;
  ASSERT_OK(arcpool_default_allocator_find(kUnused, &found));
  EXPECT_EQ(nullptr, found);
  ASSERT_OK(arcpool_default_allocator_find(kUnused, &found));
  EXPECT_EQ(nullptr, found) << "the first find created it";
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_default_allocator_find(-1, &found));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_default_allocator_find(0, nullptr));
  // What a device without an allocator reports: every figure 0.
  char json[4096];
  size_t length = 0;
  ASSERT_OK(arcpool_stats_json(nullptr, json, sizeof json, &length));
  ASSERT_LT(length, sizeof json);
  EXPECT_NE(nullptr, std::strstr(json, "\"allocations\": 0,")) << json;
  EXPECT_NE(nullptr, std::strstr(json, "\"other\": 1")) << json;
}

// arcpool_default_allocator_set never blocks. The allocator it replaces, when the table held its
// last reference, is torn down by the janitor, whose teardown waits for the pending frees. (Before,
// the caller's thread tore it down: here it would have waited for a stream held by a gate; so
// would any thread whose by-pointer allocation ended the last lookup of a retired default.)
TEST(DefaultAllocatorTable, AReplacedDefaultIsTornDownOffTheCallersThread) {
  standalone_host_allocator host;
  ASSERT_NO_FATAL_FAILURE(make_standalone_host_allocator(&host));
  arcpool_allocator_t* old = host.alloc;
  arcpool_stream_t s = host.s, user = host.other;
  std::unique_ptr<gate> busy = make_host_probe(old)->block(user);
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_allocate_async(old, kBytes, 0, s, 0, &a));
  ASSERT_OK(arcpool_record_use(a, user));
  ASSERT_OK(arcpool_deallocate_async(a, s, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));  // behind the gate
  arcpool_allocation_release(a);
  ASSERT_OK(arcpool_stream_destroy(old, s));
  ASSERT_OK(arcpool_stream_destroy(old, user));
  ASSERT_OK(arcpool_default_allocator_set(0, old));
  arcpool_allocator_destroy(old);  // the table holds the last reference

  std::promise<void> returned;
  std::future<void> set_returned = returned.get_future();
  std::atomic<bool> had_to_open{false};
  std::thread watchdog([&] {
    if (set_returned.wait_for(std::chrono::seconds(5)) == std::future_status::timeout) {
      had_to_open = true;
      busy->open();  // lets a blocked teardown, and the test, end
    }
  });
  EXPECT_OK(arcpool_default_allocator_set(0, nullptr));  // replaces it
  returned.set_value();
  watchdog.join();
  EXPECT_FALSE(had_to_open.load())
      << "the replaced default was torn down on the caller's thread, waiting for its free";
  busy->open();  // the janitor's teardown ends
}

ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(RawPointer);

}  // namespace
}  // namespace arcpool::test
