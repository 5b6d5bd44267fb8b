// Bad input and faults (design.md §10): calls for which the host has no memory left. Nothing
// may be lost: the call fails with OUT_OF_MEMORY and a message, and leaves nothing behind.
// - A by-pointer allocation whose entry cannot be recorded because the by-pointer table cannot
//   grow: the memory it allocated goes back in stream order, and every allocation recorded
//   before stays findable and freeable.
// - A view whose handle cannot be made: it takes no reference.
// - A transfer whose fence cannot be made: its event goes too, and the allocation stays.
// - A fence released when its event pool's shard cannot grow: the release allocates nothing (it
//   is noexcept), and the fence's event is kept elsewhere or destroyed.
// - A thread that exits: giving its statistics shard back (in a destructor) allocates nothing.
// - A thread's first failure: its message needs no host memory.
// - A free offered to its stream's cache when the cache cannot grow: the block goes to the pool.
// - An allocation with the memory history on: noting it never fails (the ring is made first).
// - A free by pointer that fails for host memory: the pointer stays recorded.
// - An allocator's last handle released while a record lives: the janitor holds it without
//   allocating.
// - A stream's destruction: once it retired the stream, it allocates nothing; refused its final
//   fence, it leaves the stream as it was, its cache open again; refused the queueing of a
//   cached block's free (the host driver), it writes the block off and goes on.
// - A stream's creation refused its entry: the CUDA stream it made goes again.
// - An allocator's creation refused after it made its pool: the pool goes again.
// - A default allocator set without room in the table: the table keeps no reference to it.
// - Pool memory shared with another process (the other process is this binary again, on the
//   CUDA driver): a send refused its record keeps no claim; an exporter refused its watcher's
//   thread fails and keeps nothing; the watcher drops a dead importer's claims, and an importer
//   releases an import, without allocating (an allocation it cannot queue is refused to the
//   exporter, and an event it cannot keep is destroyed or left to the process's exit).
// - A deferred free: its queue entry is made before the deallocation commits, so that a refusal
//   anywhere leaves the allocation as it was; and a leaked allocation's implicit free, which
//   cannot fail (the last reference's release), counts a refusal instead of ending the process.
// - A deferred free completed on the reclaim worker, whose waits and free the host driver
//   queues as host work: refused, it is written off and counted, and the worker goes on.
// - A free deferred to a graph's end: the reclaim worker fences the streams that captured into
//   room made at the deallocation, so that it allocates nothing (and cannot end the process).
// - A graph pool's block returned to the pool (freed, or taken by an allocation whose record
//   could not be made): the pool's list has room for it, so that the return allocates nothing.
//   A block returned by an allocation refused its record keeps the rule of where it may be
//   lent again (the stream it was freed on, in its capture). A capture's binding to a graph
//   pool: refused, it leaves the capture unbound and the pool
//   without a reference. These run on the CUDA driver (graph pools build graphs), on a GPU or
//   simcuda.
//
// Its own program: it replaces the nothrow array operator new, which only the by-pointer table's
// growth uses in arcpool, the nothrow scalar operator new (records' blocks, views' handles,
// fences), and the throwing scalar operator new (standard containers; refused only where
// arcpool's own code calls it, not an NVTX tool loaded beside it), so that a test can make
// exactly one such allocation fail.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "arcpool/arcpool.h"
#include "drivers/driver.hpp"
#include "support/address_table.hpp"
#include "support/driver_test.hpp"
#include "support/ipc_processes.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include "support/simcuda_probe.hpp"

namespace {
/// One kind of operator new that a test makes fail: while `to_fail` is set, the next `to_pass`
/// calls succeed, then the next `to_fail` calls fail.
struct failing_news {
  std::atomic<int> to_pass{0};
  std::atomic<int> to_fail{0};
  std::atomic<int> failed{0};

  /// True if this call is to fail (and counts it).
  bool take() noexcept {
    if (to_fail.load() <= 0) return false;
    int pass = to_pass.load();
    while (pass > 0 && !to_pass.compare_exchange_weak(pass, pass - 1)) {
    }
    if (pass > 0) return false;
    int left = to_fail.load();
    while (left > 0 && !to_fail.compare_exchange_weak(left, left - 1)) {
    }
    if (left > 0) failed.fetch_add(1);
    return left > 0;
  }
};
failing_news g_array_news;
failing_news g_scalar_news;
failing_news g_throwing_news;
/// Set on a thread whose every throwing allocation g_throwing_news may refuse, the standard
/// library's own included (std::string's code is in libstdc++, not in arcpool's object).
thread_local bool t_refuse_any_caller = false;
/// Set while g_throwing_news refuses only the allocations of threads with t_refused_thread set
/// (a test whose streams' workers allocate meanwhile, where a refusal ends the process).
std::atomic<bool> g_refuse_marked_threads_only{false};
thread_local bool t_refused_thread = false;

/// For its scope, g_throwing_news refuses only the calling thread's allocations.
struct refusing_this_thread_only {
  refusing_this_thread_only() {
    t_refused_thread = true;
    g_refuse_marked_threads_only = true;
  }
  ~refusing_this_thread_only() {
    g_refuse_marked_threads_only = false;
    t_refused_thread = false;
  }
};

/// The throwing operator new that this program replaces: the next definition in the process
/// (the sanitizer runtime's, or the C++ library's), so that delete matches. Looked up at the
/// first use, which may come before this file's dynamic initialization.
using throwing_new = void* (*)(std::size_t);
throwing_new next_new() noexcept {
  static const auto next = reinterpret_cast<throwing_new>(dlsym(RTLD_NEXT, "_Znwm"));
  return next;
}

/// True when `return_address` is in arcpool's code: the object (this program, or
/// libarcpool.so) that holds arcpool_transfer. A tool loaded beside it, such as the NVTX
/// injection that device-check attaches, allocates from its own object, and is not refused.
bool called_by_arcpool(const void* return_address) noexcept {
  Dl_info caller;
  Dl_info arcpool;
  return dladdr(return_address, &caller) != 0 &&
         dladdr(reinterpret_cast<const void*>(&arcpool_transfer), &arcpool) != 0 &&
         caller.dli_fbase == arcpool.dli_fbase;
}
}  // namespace

/// Fails while the test asks for it and arcpool's code calls it (std::bad_alloc); otherwise the
/// next definition's.
void* operator new(std::size_t bytes) {
  const throwing_new next = next_new();
  if (next == nullptr || (g_throwing_news.to_fail.load() > 0 &&
                          (t_refused_thread || !g_refuse_marked_threads_only.load()) &&
                          (t_refuse_any_caller || called_by_arcpool(__builtin_return_address(0))) &&
                          g_throwing_news.take())) {
    throw std::bad_alloc();
  }
  return next(bytes);
}

/// Fails while the test asks for it; otherwise the default array new (so that delete[] matches).
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
  if (g_array_news.take()) return nullptr;
  try {
    return ::operator new[](bytes);
  } catch (...) {
    return nullptr;
  }
}

/// Fails while the test asks for it; otherwise the next definition's throwing new (so that
/// delete matches, also under AddressSanitizer), unaffected by g_throwing_news.
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  const throwing_new next = next_new();
  if (g_scalar_news.take() || next == nullptr) return nullptr;
  try {
    return next(bytes);
  } catch (...) {
    return nullptr;
  }
}

namespace {

constexpr size_t kBytes = 4096;

/// An allocator on `driver` (null, with a failure recorded, when it cannot be made), its owned
/// pool exportable as `ipc_handle_types`. The null driver allocates no host memory of its own,
/// and starts no thread of its own.
arcpool_allocator_t* allocator_on(arcpool_driver_kind_t driver, uint32_t ipc_handle_types = 0) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = driver;
  options.ipc_handle_types = ipc_handle_types;
  arcpool_allocator_t* alloc = nullptr;
  EXPECT_OK(arcpool_allocator_create(&options, &alloc));
  return alloc;
}

/// The allocator's statistics.
arcpool_stats_t stats_of(arcpool_allocator_t* alloc) {
  arcpool_stats_t st;
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  EXPECT_OK(arcpool_stats_get(alloc, &st));
  return st;
}

/// The data pointer of `a` (null, with a failure recorded, if it cannot be read).
void* data_of(const arcpool_allocation_t* a) {
  void* p = nullptr;
  EXPECT_OK(arcpool_allocation_data(a, &p));
  return p;
}

/// Calls `call` (`what`) again and again, each attempt letting one more of arcpool's throwing
/// allocations through before it refuses the next: wherever the refusal lands, the attempt must
/// fail with OUT_OF_MEMORY, and `after_refusal(passed)` checks that it changed nothing, until
/// one needs no more than it was let through and succeeds. At least one attempt must have been
/// refused.
template <typename Call, typename Check>
void expect_refused_calls_change_nothing(const char* what, Call call, Check after_refusal) {
  int refusals = 0;
  for (int passed = 0;; ++passed) {
    ASSERT_LT(passed, 100) << what << " kept failing";
    const int failed_before = g_throwing_news.failed.load();
    g_throwing_news.to_pass = passed;
    g_throwing_news.to_fail = 1;
    const arcpool_status_t status = call();
    g_throwing_news.to_fail = 0;
    g_throwing_news.to_pass = 0;
    if (status == ARCPOOL_STATUS_SUCCESS) break;
    ASSERT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
    ASSERT_EQ(failed_before + 1, g_throwing_news.failed.load()) << "failed without a refusal";
    after_refusal(passed);
    if (::testing::Test::HasFatalFailure()) return;
    ++refusals;
  }
  EXPECT_LT(0, refusals) << "no attempt was refused: the test proves nothing";
}

TEST(HostMemoryExhaustion, AnEntryTakenOutGoesBackWhenItsTableFilledAndCannotGrow) {
  // A by-pointer free takes its entry out of the map, and puts it back when the free is refused
  // (nothing freed). Other threads' inserts may fill the table meanwhile: without host memory
  // to grow, the entry still goes back, over the table's half-full limit. Refused, the map's
  // reference went and freed the memory the caller was told was not freed.
  struct tag {
    int n;
  };
  using table = arcpool::detail::address_table<tag>;
  table t;
  tag values[130] = {};
  uintptr_t start = 0x100000;
  // Full to its limit (half of its first 256 slots): the next insert must grow.
  while (t.size() < 128) {
    ASSERT_TRUE(t.insert(start, 64, &values[t.size()]));
    start += 0x1000;
  }
  const uintptr_t taken = 0x100000;
  const int failed_before = g_array_news.failed.load();
  t.erase(t.find_start(taken));                    // the free takes it out
  ASSERT_TRUE(t.insert(start, 64, &values[128]));  // another thread fills it again
  g_array_news.to_fail = 1;
  EXPECT_FALSE(t.insert(start + 0x1000, 64, &values[129]));  // a new entry is refused
  EXPECT_EQ(0, g_array_news.to_fail.load()) << "the table did not try to grow";
  g_array_news.to_fail = 1;
  EXPECT_TRUE(t.put_back(taken, 64, &values[0])) << "the entry taken out was lost";
  EXPECT_EQ(failed_before + 2, g_array_news.failed.load()) << "the put-back did not try to grow";
  g_array_news.to_fail = 0;
  g_array_news.failed = failed_before;  // as it was: the tests of one process share the count
  ASSERT_NE(table::npos, t.find_start(taken));
  EXPECT_EQ(&values[0], t.value_at(t.find_start(taken)));
  EXPECT_EQ(129u, t.size());
  for (uintptr_t s = 0x100000; s <= start; s += 0x1000)
    EXPECT_NE(table::npos, t.find_start(s)) << "entry " << s << " lost its probe sequence";
}

TEST(HostMemoryExhaustion, AByPointerAllocationThatCannotBeRecordedFailsAndLosesNothing) {
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_HOST);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();

  std::vector<void*> recorded;
  for (int i = 0; i < 10; ++i) {
    void* p = nullptr;
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_malloc_async(alloc, kBytes, 0, s, &p))
        << arcpool_last_error();
    recorded.push_back(p);
  }
  // The table grows as it fills: allocate until its next growth fails.
  g_array_news.to_fail = 1;
  void* refused = reinterpret_cast<void*>(1);
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  while (g_array_news.failed.load() == 0 && recorded.size() < 100000) {
    void* p = nullptr;
    status = arcpool_allocator_malloc_async(alloc, kBytes, 0, s, &p);
    if (status != ARCPOOL_STATUS_SUCCESS) {
      refused = p;
      break;
    }
    recorded.push_back(p);
  }
  g_array_news.to_fail = 0;
  ASSERT_EQ(1, g_array_news.failed.load()) << "the table never grew";
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status);
  EXPECT_NE(std::string::npos, std::string(arcpool_last_error()).find("no host memory"))
      << arcpool_last_error();
  EXPECT_EQ(nullptr, refused);

  // The refused allocation was freed; the recorded ones are all still live.
  EXPECT_OK(arcpool_stream_synchronize(alloc, s));
  arcpool_stats_t st = stats_of(alloc);
  EXPECT_EQ(recorded.size(), st.allocations_in_use_current);
  EXPECT_EQ(recorded.size() * kBytes, st.bytes_in_use_current);
  EXPECT_EQ(recorded.size() + 1, st.allocations);
  EXPECT_EQ(1u, st.deallocations);

  // The table grows now, and every allocation frees by its pointer.
  void* later = nullptr;
  EXPECT_OK(arcpool_allocator_malloc_async(alloc, kBytes, 0, s, &later));
  recorded.push_back(later);
  for (void* p : recorded)
    EXPECT_OK(arcpool_allocator_free_async(alloc, p, s));
  EXPECT_OK(arcpool_stream_synchronize(alloc, s));
  st = stats_of(alloc);
  EXPECT_EQ(0u, st.allocations_in_use_current);
  EXPECT_EQ(0u, st.bytes_in_use_current);

  EXPECT_OK(arcpool_stream_destroy(alloc, s));
  arcpool_allocator_destroy(alloc);
}

// A host-driver record refused for host memory leaves its event as it was, as a failed
// cudaEventRecord does. It published the new record's marker before queueing its completion,
// so the event never completed: queried false for ever, and a wait on it hung.
TEST(HostMemoryExhaustion, AHostEventRecordRefusedForMemoryLeavesTheEventAsItWas) {
  arcpool::detail::driver_config config;
  config.kind = ARCPOOL_DRIVER_HOST;
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  const std::unique_ptr<arcpool::detail::driver> drv =
      arcpool::detail::make_host_driver(config, &status);
  ASSERT_OK(status);
  arcpool_stream_t s = nullptr;
  ASSERT_OK(drv->stream_create(&s));
  arcpool::detail::event_handle e = nullptr;
  ASSERT_OK(drv->event_create(&e));
  int refused = 0;
  for (int passed = 0; passed < 6; ++passed) {
    bool threw = false;
    t_refuse_any_caller = true;
    g_throwing_news.to_pass = passed;
    g_throwing_news.to_fail = 1;
    try {
      (void)drv->event_record(e, s);
    } catch (const std::bad_alloc&) {
      threw = true;
    }
    g_throwing_news.to_fail = 0;
    g_throwing_news.to_pass = 0;
    t_refuse_any_caller = false;
    refused += threw ? 1 : 0;
    ASSERT_OK(drv->stream_synchronize(s));
    bool done = false;
    ASSERT_OK(drv->event_query(e, &done));
    EXPECT_TRUE(done) << "the event waits for a record refused at allocation " << passed;
  }
  EXPECT_LE(2, refused) << "the record's allocations were not refused";
  drv->event_destroy(e);
  EXPECT_OK(drv->stream_destroy(s));
}

TEST(HostMemoryExhaustion, AThreadsFirstFailureIsReportedWithoutHostMemory) {
  // On a thread that has reported nothing yet, a call refused every host allocation (the
  // standard library's included) fails with OUT_OF_MEMORY and a message: the message itself
  // needs no host memory (a guarded entry point's catch reports it in a noexcept function,
  // where a throw ends the process). The null driver: no thread of its own allocates meanwhile.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_NULL);
  ASSERT_NE(nullptr, alloc);
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  arcpool_stream_t s = nullptr;
  std::string message;
  std::thread([&] {
    const int failed_before = g_throwing_news.failed.load();
    t_refuse_any_caller = true;
    g_throwing_news.to_fail = 1000;
    g_scalar_news.to_fail = 1000;
    status = arcpool_stream_create(alloc, &s);
    g_throwing_news.to_fail = 0;
    g_scalar_news.to_fail = 0;
    t_refuse_any_caller = false;
    EXPECT_LT(failed_before, g_throwing_news.failed.load()) << "nothing was refused";
    message = arcpool_last_error();
  }).join();
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << message;
  EXPECT_EQ(nullptr, s);
  EXPECT_EQ(0u, message.find("ARCPOOL_STATUS_OUT_OF_MEMORY: ")) << message;
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, AByPointerFreeTheHostHasNoMemoryForKeepsThePointerFindable) {
  // A free by pointer on another stream queues a deferred free, whose entry needs host memory:
  // refused, the free fails with OUT_OF_MEMORY and the pointer stays recorded, so that the
  // same free succeeds later. The null driver.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_NULL);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t from = nullptr, to = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &from)) << arcpool_last_error();
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &to)) << arcpool_last_error();
  void* p = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_malloc_async(alloc, kBytes, 0, from, &p))
      << arcpool_last_error();
  const int failed_before = g_throwing_news.failed.load();
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_allocator_free_async(alloc, p, to);
  g_throwing_news.to_fail = 0;
  ASSERT_LT(failed_before, g_throwing_news.failed.load()) << "nothing was refused";
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
  EXPECT_EQ(1u, stats_of(alloc).allocations_in_use_current);
  EXPECT_OK(arcpool_allocator_free_async(alloc, p, to));  // still recorded
  EXPECT_OK(arcpool_allocator_trim(alloc, 0));
  EXPECT_EQ(0u, stats_of(alloc).allocations_in_use_current);
  EXPECT_OK(arcpool_stream_destroy(alloc, from));
  EXPECT_OK(arcpool_stream_destroy(alloc, to));
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, AByPointerFreeWhosePoolFreeCannotBeQueuedIsWrittenOff) {
  // The host driver queues a pool free as host work, which may find no host memory after the
  // deallocation committed (a block too large for the stream's cache). The block is written
  // off and counted, as at a flush or in the reclaimer (design.md §10): the free succeeds and
  // the pointer is gone. The free failed, and its entry, deallocated, went back to the map, so
  // that every later free of it was refused and the allocator never emptied.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_HOST);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
  constexpr size_t kUncached = size_t{2} << 20;  // above the cache's largest block
  void* p = nullptr;
  {
#if defined(__SANITIZE_ADDRESS__)
    __lsan::ScopedDisabler leaks_expected;  // the refused free writes the block off
#endif
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_malloc_async(alloc, kUncached, 0, s, &p))
        << arcpool_last_error();
  }
  ASSERT_OK(arcpool_stream_synchronize(alloc, s));
  const int failed_before = g_throwing_news.failed.load();
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_allocator_free_async(alloc, p, s);
  g_throwing_news.to_fail = 0;
  ASSERT_LT(failed_before, g_throwing_news.failed.load()) << "nothing was refused";
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, status) << arcpool_last_error();
  EXPECT_STATUS(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_allocator_free_async(alloc, p, s));
  const arcpool_stats_t st = stats_of(alloc);
  EXPECT_EQ(0u, st.allocations_in_use_current);
  EXPECT_EQ(0u, st.bytes_held_current);
  EXPECT_EQ(1u, st.reclaim_failures);
  EXPECT_EQ(0u, st.frees) << "a block written off counted as freed";
  EXPECT_OK(arcpool_stream_destroy(alloc, s));
  arcpool_allocator_destroy(alloc);
}

/// The sum of `alloc`'s per-stream rows' cross_stream_frees.
uint64_t rows_cross_stream_frees(arcpool_allocator_t* alloc) {
  std::vector<arcpool_stream_stats_t> rows(ARCPOOL_STREAM_STATS_ROWS + 1);
  size_t count = 0;
  EXPECT_OK(arcpool_stream_stats_list(alloc, rows.data(), sizeof(rows[0]), rows.size(), &count));
  uint64_t sum = 0;
  for (size_t i = 0; i < count && i < rows.size(); ++i)
    sum += rows[i].cross_stream_frees;
  return sum;
}

TEST(HostMemoryExhaustion, ACrossStreamFreeWrittenOffCountsOnNoRow) {
  // A cross-stream free whose pool free the host driver cannot queue (no host memory, after the
  // commit) is written off: counted in reclaim_failures, not as a free. The origin's row counted
  // it as a cross-stream free all the same, and the rows no longer added up to the total.
  // Each free is refused at a later host allocation, by either route to the pool.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_HOST);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t origin = nullptr, caller = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc, &origin));
  ASSERT_OK(arcpool_stream_create(alloc, &caller));
  constexpr size_t kUncached = size_t{2} << 20;  // above the cache's largest block
  // The host streams' workers allocate while they wait: only this thread is refused.
  const refusing_this_thread_only only_here;
  int written_off = 0;
  for (const uint32_t flags : {uint32_t{ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN},
                               uint32_t{ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE}}) {
    for (int passed = 0; passed < 12; ++passed) {
      arcpool_allocation_t* a = nullptr;
      {
#if defined(__SANITIZE_ADDRESS__)
        __lsan::ScopedDisabler leaks_expected;  // a refused free writes the block off
#endif
        ASSERT_OK(arcpool_allocate_async(alloc, kUncached, 0, origin, 0, &a));
      }
      ASSERT_OK(arcpool_stream_synchronize(alloc, origin));
      const uint64_t failures_before = stats_of(alloc).reclaim_failures;
      g_throwing_news.to_pass = passed;
      g_throwing_news.to_fail = 1;
      const arcpool_status_t status = arcpool_deallocate_async(a, caller, flags);
      g_throwing_news.to_fail = 0;
      g_throwing_news.to_pass = 0;
      if (status != ARCPOOL_STATUS_SUCCESS) {  // refused before the commit: nothing changed
        EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
        EXPECT_OK(arcpool_deallocate_async(a, caller, flags));
      }
      arcpool_allocation_release(a);
      ASSERT_OK(arcpool_stream_synchronize(alloc, origin));
      ASSERT_OK(arcpool_stream_synchronize(alloc, caller));
      const arcpool_stats_t st = stats_of(alloc);
      written_off += st.reclaim_failures > failures_before ? 1 : 0;
      EXPECT_EQ(st.cross_stream_frees, rows_cross_stream_frees(alloc))
          << "flags " << flags << ", refused after " << passed << " host allocations";
    }
  }
  EXPECT_LE(2, written_off) << "no free was written off: the test no longer tests anything";
  EXPECT_OK(arcpool_stream_destroy(alloc, origin));
  EXPECT_OK(arcpool_stream_destroy(alloc, caller));
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, ARecordStreamTheHostHasNoMemoryForKeepsNoReference) {
  // arcpool_record_stream finds the by-pointer allocation with a reference of its own, which it
  // drops after the use is recorded. Refused host memory for the use record, it fails with
  // OUT_OF_MEMORY and still drops that reference: once freed, no record is left (a record left
  // behind holds its allocator, its pool and its cached memory for ever). The null driver.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_NULL);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr, user = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &user)) << arcpool_last_error();
  void* p = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_malloc_async(alloc, kBytes, 0, s, &p))
      << arcpool_last_error();
  ASSERT_NO_FATAL_FAILURE(expect_refused_calls_change_nothing(
      "record_stream", [&] { return arcpool_record_stream(p, user); },
      [&](int) { EXPECT_EQ(1u, stats_of(alloc).allocations_in_use_current); }));
  EXPECT_OK(arcpool_allocator_free_async(alloc, p, s));
  EXPECT_OK(arcpool_allocator_trim(alloc, 0));
  EXPECT_TRUE(arcpool::detail::from_handle(alloc)->quiescent())
      << "a refused record_stream kept a reference to the allocation's record";
  EXPECT_OK(arcpool_stream_destroy(alloc, s));
  EXPECT_OK(arcpool_stream_destroy(alloc, user));
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, AnAllocatorReleasedWithLiveRecordsWithoutHostMemoryGoesOn) {
  // The last handle of an allocator whose allocation still lives hands it to the janitor, in a
  // release that cannot fail: with every host allocation of arcpool's refused, the release
  // returns (the janitor holds it without allocating, and starts its thread later), and the
  // allocation is freed afterwards. Deterministic in a process of its own (ctest runs each
  // test so): another test may have started the janitor already. The null driver.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_NULL);
  ASSERT_NE(nullptr, alloc);
  arcpool_allocation_t* a = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(alloc, kBytes, 0, nullptr, 0, &a))
      << arcpool_last_error();
  g_throwing_news.to_fail = 1000;
  g_scalar_news.to_fail = 1000;
  arcpool_allocator_destroy(alloc);  // its last handle: the allocation's record keeps it
  g_throwing_news.to_fail = 0;
  g_scalar_news.to_fail = 0;
  EXPECT_OK(arcpool_deallocate_async(a, nullptr, 0));
  arcpool_allocation_release(a);  // the last record: the janitor deletes the allocator
}

/// Allocates and frees on `s` twice: the second allocation is a hit of `s`'s cache unless a
/// retirement closed it (`why` otherwise).
void expect_cache_open(arcpool_allocator_t* alloc, arcpool_stream_t s, const char* why) {
  const uint64_t hits_before = stats_of(alloc).cache_hits;
  for (int i = 0; i < 2; ++i) {
    arcpool_allocation_t* a = nullptr;
    EXPECT_OK(arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a));
    if (a == nullptr) break;
    EXPECT_OK(arcpool_deallocate_async(a, s, 0));
    arcpool_allocation_release(a);
  }
  EXPECT_EQ(hits_before + 1, stats_of(alloc).cache_hits) << why;
}

TEST(HostMemoryExhaustion, AStreamDestroyedWithoutHostMemoryGoesOrStaysAsItWas) {
  // Destroying a created stream retires it (its cache closed and flushed, its final fence
  // recorded), which cannot be undone: with every host allocation of arcpool's refused, the
  // destroy succeeds, or fails before the retirement and leaves the stream as it was (its
  // cache still keeps a freed block for the next allocation). The null driver.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_NULL);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_stream_destroy(alloc, s);
  g_throwing_news.to_fail = 0;
  if (status != ARCPOOL_STATUS_SUCCESS) {
    EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
    expect_cache_open(alloc, s, "the failed destroy closed the stream's cache: it retired it");
    EXPECT_OK(arcpool_stream_destroy(alloc, s));
  }
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, AStreamWhoseFinalFenceTheHostHasNoMemoryForStaysAsItWas) {
  // Destroying or unregistering a stream closes and flushes its cache, then records its final
  // fence: refused the fence's record (a nothrow allocation; a new allocator's event pool has
  // no fence to reuse), the call fails and the stream stays as it was, its cache open again.
  // The null driver.
  for (const bool created : {true, false}) {
    SCOPED_TRACE(created ? "stream_destroy" : "stream_unregister");
    arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_NULL);
    ASSERT_NE(nullptr, alloc);
    arcpool_stream_t s = reinterpret_cast<arcpool_stream_t>(uintptr_t{0x5000});
    if (created) {
      ASSERT_OK(arcpool_stream_create(alloc, &s));
    } else {
      ASSERT_OK(arcpool_stream_register(alloc, s));
    }
    auto retire = [&] {
      return created ? arcpool_stream_destroy(alloc, s) : arcpool_stream_unregister(alloc, s);
    };
    const int refused_before = g_scalar_news.failed.load();
    g_scalar_news.to_fail = 1;
    const arcpool_status_t status = retire();
    g_scalar_news.to_fail = 0;
    ASSERT_EQ(refused_before + 1, g_scalar_news.failed.load()) << "nothing was refused";
    EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
    expect_cache_open(alloc, s, "the failed call left the stream's cache closed");
    EXPECT_OK(retire());
    arcpool_allocator_destroy(alloc);
  }
}

TEST(HostMemoryExhaustion, AStreamWhoseCachedBlockCannotBeQueuedForFreeingCanStillBeDestroyed) {
  // Destroying a stream flushes its cache first: on the host driver each free is queued as host
  // work, which allocates. Refused, the block is written off (counted in reclaim_failures) and
  // the flush goes on; a destroy that fails later leaves the stream for the next one to retire.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_HOST);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc, &s));
  arcpool_allocation_t* a = nullptr;
  {
#if defined(__SANITIZE_ADDRESS__)
    __lsan::ScopedDisabler leaks_expected;  // the refused free writes the block off
#endif
    ASSERT_OK(arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a));
  }
  ASSERT_OK(arcpool_deallocate_async(a, s, 0));  // into the stream's cache
  arcpool_allocation_release(a);
  ASSERT_EQ(kBytes, stats_of(alloc).bytes_cached_current);
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_stream_destroy(alloc, s);
  g_throwing_news.to_fail = 0;
  EXPECT_EQ(1u, stats_of(alloc).reclaim_failures) << "the cached block was not written off";
  EXPECT_EQ(0u, stats_of(alloc).bytes_cached_current);
  if (status != ARCPOOL_STATUS_SUCCESS) {
    EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
    EXPECT_OK(arcpool_stream_destroy(alloc, s)) << "the failed destroy kept its claim";
  }
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, AViewTheHostHasNoMemoryForTakesNoReference) {
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_HOST);
  ASSERT_NE(nullptr, alloc);
  arcpool_allocation_t* a = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(alloc, kBytes, 0, nullptr, 0, &a))
      << arcpool_last_error();

  arcpool_allocation_t* view = nullptr;
  const int refused_before = g_scalar_news.failed.load();  // by the tests before, in one process
  g_scalar_news.to_fail = 1;
  const arcpool_status_t status = arcpool_allocation_view(a, 0, kBytes / 2, &view);
  g_scalar_news.to_fail = 0;
  ASSERT_EQ(refused_before + 1, g_scalar_news.failed.load())
      << "the view's handle was not the call's allocation";
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status);
  EXPECT_NE(std::string::npos, std::string(arcpool_last_error()).find("no host memory"))
      << arcpool_last_error();
  EXPECT_EQ(nullptr, view);
  arcpool_allocation_info_t info;
  info.struct_size = sizeof(info);
  info.version = ARCPOOL_ALLOCATION_INFO_VERSION;
  EXPECT_OK(arcpool_allocation_info(a, &info));
  EXPECT_EQ(1u, info.references) << "the refused view kept a reference";

  EXPECT_OK(arcpool_allocation_discard_and_release(a));
  EXPECT_OK(arcpool_stream_synchronize(alloc, nullptr));
  arcpool_allocator_destroy(alloc);
}

/// An allocation on stream `from` of an allocator, and a second stream `to` to hand it to.
struct handoff {
  arcpool_allocator_t* alloc = nullptr;
  arcpool_stream_t from = nullptr;
  arcpool_stream_t to = nullptr;
  arcpool_allocation_t* a = nullptr;

  /// Makes the streams and the allocation on `allocator` (a fatal failure if one cannot be).
  void open(arcpool_allocator_t* allocator) {
    alloc = allocator;
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &from)) << arcpool_last_error();
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &to)) << arcpool_last_error();
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(alloc, kBytes, 0, from, 0, &a))
        << arcpool_last_error();
  }
  /// Makes an allocator of `driver` with the default options, then opens on it.
  void open_on(arcpool_driver_kind_t driver) {
    arcpool_allocator_t* allocator = allocator_on(driver);
    ASSERT_NE(nullptr, allocator);
    open(allocator);
  }
  /// The allocation's current stream.
  arcpool_stream_t current() const {
    arcpool_allocation_info_t info;
    info.struct_size = sizeof(info);
    info.version = ARCPOOL_ALLOCATION_INFO_VERSION;
    EXPECT_OK(arcpool_allocation_info(a, &info));
    return info.current_stream;
  }
  /// Hands the allocation to `to` (host memory permitting), frees it there, and destroys the
  /// streams.
  void close() {
    EXPECT_OK(arcpool_transfer(a, to));
    EXPECT_OK(arcpool_deallocate_async(a, to, 0));
    arcpool_allocation_release(a);
    EXPECT_OK(arcpool_stream_synchronize(alloc, to));
    EXPECT_OK(arcpool_stream_destroy(alloc, from));
    EXPECT_OK(arcpool_stream_destroy(alloc, to));
  }
  /// Destroys the streams and the allocator, whatever became of the allocation.
  void destroy() {
    EXPECT_OK(arcpool_stream_destroy(alloc, from));
    EXPECT_OK(arcpool_stream_destroy(alloc, to));
    arcpool_allocator_destroy(alloc);
  }
};

TEST(HostMemoryExhaustion, AFreeWhoseStreamCacheCannotGrowGoesToThePool) {
  // A deallocation that waits for its use records and frees on its stream (after its commit)
  // offers the block to the stream's cache: without host memory for the cache's bin, the
  // block goes back to the pool instead, and the deallocation succeeds. The null driver.
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_NULL;
  options.use_record_routing = ARCPOOL_ROUTING_WAIT_AND_FREE;
  arcpool_allocator_t* alloc = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_create(&options, &alloc))
      << arcpool_last_error();
  handoff h;
  ASSERT_NO_FATAL_FAILURE(h.open(alloc));
  EXPECT_OK(arcpool_record_use(h.a, h.to));
  const int failed_before = g_throwing_news.failed.load();
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_deallocate_async(h.a, h.from, 0);
  g_throwing_news.to_fail = 0;
  EXPECT_LT(failed_before, g_throwing_news.failed.load()) << "nothing was refused";
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, status) << arcpool_last_error();
  arcpool_allocation_release(h.a);
  const arcpool_stats_t st = stats_of(alloc);
  EXPECT_EQ(0u, st.bytes_cached_current);
  EXPECT_EQ(0u, st.bytes_held_current) << "the block was lost";
  EXPECT_EQ(1u, st.frees);
  h.destroy();
}

TEST(HostMemoryExhaustion, AnAllocationTheHistoryHasNoMemoryToNoteLosesNothing) {
  // With the memory history on, each attempt (on an allocator of its own, so that nothing an
  // earlier attempt made is there already) lets one more of arcpool's throwing allocations
  // through before it refuses the next, until one needs no more: each succeeds, or fails
  // holding nothing. Noting the block and the allocation in the history (after the pool gave
  // the block) never fails: a block the history has no room for is left out of it.
  int refused_attempts = 0;  // attempts that had an allocation refused, failed or not
  for (int passed = 0;; ++passed) {
    ASSERT_LT(passed, 100) << "the allocation kept failing";
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_NULL;
    options.history_entries = 64;
    arcpool_allocator_t* alloc = nullptr;
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_create(&options, &alloc))
        << arcpool_last_error();
    arcpool_stream_t s = nullptr;
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
    const int failed_before = g_throwing_news.failed.load();
    g_throwing_news.to_pass = passed;
    g_throwing_news.to_fail = 1;
    arcpool_allocation_t* a = nullptr;
    const arcpool_status_t status = arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a);
    g_throwing_news.to_fail = 0;
    g_throwing_news.to_pass = 0;
    const bool refused = g_throwing_news.failed.load() != failed_before;
    if (refused) ++refused_attempts;
    if (status == ARCPOOL_STATUS_SUCCESS) {
      EXPECT_OK(arcpool_deallocate_async(a, s, 0));
      arcpool_allocation_release(a);
    } else {
      EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
      EXPECT_EQ(failed_before + 1, g_throwing_news.failed.load()) << "failed without a refusal";
      EXPECT_EQ(0u, stats_of(alloc).bytes_held_current)
          << "a failed allocation held its block (refused after " << passed << " allocations)";
    }
    EXPECT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);
    if (HasFailure() || !refused) break;  // every allocation it made was let through
  }
  EXPECT_LT(0, refused_attempts) << "no attempt was refused: the test proves nothing";
}

TEST(HostMemoryExhaustion, AFenceTheHostHasNoMemoryForFailsItsTransferAndChangesNothing) {
  // A transfer's fence is the first of its pool's (no event to reuse): its record cannot be
  // made. The event made for it goes too (LeakSanitizer checks it in the ASan build), and the
  // allocation stays on its stream.
  handoff h;
  ASSERT_NO_FATAL_FAILURE(h.open_on(ARCPOOL_DRIVER_HOST));

  const int failed_before = g_scalar_news.failed.load();
  g_scalar_news.to_fail = 1;
  const arcpool_status_t status = arcpool_transfer(h.a, h.to);
  g_scalar_news.to_fail = 0;
  ASSERT_EQ(failed_before + 1, g_scalar_news.failed.load())
      << "the transfer made no allocation the test can fail";
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status);
  EXPECT_NE(std::string::npos, std::string(arcpool_last_error()).find("no host memory"))
      << arcpool_last_error();
  EXPECT_EQ(h.from, h.current()) << "the refused transfer moved the allocation";

  h.close();  // the transfer works now
  arcpool_allocator_destroy(h.alloc);
}

TEST(HostMemoryExhaustion, AFenceReleasedWhenItsShardCannotGrowIsNotKeptAndLosesNothing) {
  // The null driver allocates nothing of its own, so that the one container allocation a
  // transfer makes is the event pool's: its first fence, released at the transfer's end, needs
  // room in its thread's shard. A release is noexcept: it may not allocate that room.
  // This thread's own state (its records, its stream cache) is made on another allocator first.
  arcpool_allocator_t* warm = allocator_on(ARCPOOL_DRIVER_NULL);
  ASSERT_NE(nullptr, warm);
  handoff warm_up;
  ASSERT_NO_FATAL_FAILURE(warm_up.open(warm));
  warm_up.close();
  arcpool_allocator_destroy(warm);

  handoff h;
  ASSERT_NO_FATAL_FAILURE(h.open_on(ARCPOOL_DRIVER_NULL));
  // The first refused allocation is the shard's storage, which its first fence reserves; a
  // second would be one the fence's release made.
  const int failed_before = g_throwing_news.failed.load();
  g_throwing_news.to_fail = 2;
  const arcpool_status_t status = arcpool_transfer(h.a, h.to);
  g_throwing_news.to_fail = 0;
  ASSERT_EQ(failed_before + 1, g_throwing_news.failed.load())
      << "the transfer did not reserve its shard's storage, or not once";
  EXPECT_OK(status);
  EXPECT_EQ(h.to, h.current());

  // The pool works on: the allocation goes back and forth with host memory.
  EXPECT_OK(arcpool_transfer(h.a, h.from));
  h.close();
  arcpool_allocator_destroy(h.alloc);
}

TEST(HostMemoryExhaustion, AThreadThatExitsWithoutHostMemoryGivesItsShardBackAndEndsCleanly) {
  // A thread takes a statistics shard at its first operation and gives it back in a destructor
  // at its exit, where a throw ends the process. ctest runs this test in a process of its own,
  // where the thread's index is the first one given back: a table that grew as indices came
  // back would allocate there.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_NULL);  // no thread to take a refusal
  ASSERT_NE(nullptr, alloc);
  const int failed_before = g_throwing_news.failed.load();
  std::thread([alloc] {
    arcpool_allocation_t* a = nullptr;
    EXPECT_OK(arcpool_allocate_async(alloc, kBytes, 0, nullptr, 0, &a));
    EXPECT_OK(arcpool_deallocate_async(a, nullptr, 0));
    arcpool_allocation_release(a);
    g_throwing_news.to_fail = 1;  // from here to the thread's end
  }).join();
  const int refused = g_throwing_news.failed.load() - failed_before;
  g_throwing_news.to_fail = 0;
  EXPECT_EQ(0, refused) << "the thread's exit allocated";

  // The allocator works on, from this thread and from another.
  arcpool_allocation_t* a = nullptr;
  EXPECT_OK(arcpool_allocate_async(alloc, kBytes, 0, nullptr, 0, &a));
  std::thread([a] { EXPECT_OK(arcpool_deallocate_async(a, nullptr, 0)); }).join();
  arcpool_allocation_release(a);
  arcpool_allocator_destroy(alloc);
}

/// Stream `to` of a host-driver allocator, held by a host function until release(): fences
/// recorded on it stay pending, so deferred frees fenced there stay queued.
struct held_stream {
  arcpool_allocator_t* alloc = nullptr;
  arcpool_stream_t from = nullptr;
  arcpool_stream_t to = nullptr;
  std::atomic<bool> go{false};

  void open() {
    alloc = allocator_on(ARCPOOL_DRIVER_HOST);
    ASSERT_NE(nullptr, alloc);
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &from)) << arcpool_last_error();
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &to)) << arcpool_last_error();
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_launch_host_func(
                                          alloc, to,
                                          [](void* flag) {
                                            while (!static_cast<std::atomic<bool>*>(flag)->load())
                                              std::this_thread::yield();
                                          },
                                          &go))
        << arcpool_last_error();
  }
  /// A deferred free fenced on `to`, queued (the reclaim worker starts, and the queue holds one).
  void queue_one() {
    arcpool_allocation_t* x = nullptr;
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(alloc, kBytes, 0, from, 0, &x))
        << arcpool_last_error();
    EXPECT_OK(arcpool_deallocate_async(x, to, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
    arcpool_allocation_release(x);
  }
  arcpool_stats_t stats() const { return stats_of(alloc); }
  /// Lets `to` run and completes every deferred free.
  void complete() {
    go = true;
    EXPECT_OK(arcpool_stream_synchronize(alloc, to));
    EXPECT_OK(arcpool_allocator_trim(alloc, 0));
  }
  /// Destroys the streams and the allocator.
  void close() {
    EXPECT_OK(arcpool_stream_destroy(alloc, from));
    EXPECT_OK(arcpool_stream_destroy(alloc, to));
    arcpool_allocator_destroy(alloc);
  }
};

TEST(HostMemoryExhaustion, ADeferredFreeTheHostHasNoMemoryForFailsAndLosesNothing) {
  // Each attempt lets one more of arcpool's throwing allocations through before it refuses the
  // next: wherever the refusal lands, the call fails and the allocation stays as it was, until
  // an attempt needs no more than it was let through. The queue holds one free (fenced on the
  // held stream), so that queueing the next grows a queue kept in a vector.
  held_stream h;
  ASSERT_NO_FATAL_FAILURE(h.open());
  ASSERT_NO_FATAL_FAILURE(h.queue_one());
  arcpool_allocation_t* a = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(h.alloc, kBytes, 0, h.from, 0, &a))
      << arcpool_last_error();
  ASSERT_NO_FATAL_FAILURE(expect_refused_calls_change_nothing(
      "the deallocation",
      [&] { return arcpool_deallocate_async(a, h.to, ARCPOOL_DEALLOCATE_FLAG_DEFERRED); },
      [&](int passed) {
        ASSERT_EQ(1, arcpool_allocation_is_terminal(a))
            << "a deallocation that failed for host memory changed the allocation"
            << " (refused after " << passed << " allocations)";
      }));
  arcpool_allocation_release(a);
  EXPECT_EQ(2u, h.stats().deferred_frees);

  h.complete();  // every free completes: nothing was lost
  const arcpool_stats_t st = h.stats();
  EXPECT_EQ(0u, st.allocations_in_use_current);
  EXPECT_EQ(0u, st.bytes_pending_free_current);
  EXPECT_EQ(0u, st.reclaim_failures);
  h.close();
}

TEST(HostMemoryExhaustion, ALeakedAllocationsFreeTheHostHasNoMemoryForIsCountedNotFatal) {
  // A leaked owner's last reference frees the memory implicitly, in a release that cannot fail:
  // with a use record of another stream its free is deferred. With every allocation of
  // arcpool's refused, the free is abandoned and counted; the process goes on. (The null
  // driver: the memory it abandons is no host memory, which LeakSanitizer would report.)
  handoff h;
  ASSERT_NO_FATAL_FAILURE(h.open_on(ARCPOOL_DRIVER_NULL));
  EXPECT_OK(arcpool_record_use(h.a, h.to));
  const int failed_before = g_throwing_news.failed.load();
  g_throwing_news.to_fail = 1000;
  arcpool_allocation_release(h.a);  // the last reference of a live allocation
  g_throwing_news.to_fail = 0;
  EXPECT_LT(failed_before, g_throwing_news.failed.load()) << "nothing was refused";
  const arcpool_stats_t st = stats_of(h.alloc);
  EXPECT_EQ(1u, st.reclaim_failures);
  EXPECT_EQ(0u, st.implicit_frees);
  // The allocation is gone with its record, its memory written off: nothing stays counted.
  EXPECT_EQ(0u, st.allocations_in_use_current);
  EXPECT_EQ(0u, st.bytes_in_use_current);
  EXPECT_EQ(0u, st.bytes_held_current);
  h.destroy();
}

TEST(HostMemoryExhaustion, TheDataOfADeallocatedAllocationIsRefusedWithoutHostMemory) {
  // arcpool_allocation_data is not guarded: its refusal must name the allocation without
  // allocating, or std::bad_alloc leaves the C API.
  handoff h;
  ASSERT_NO_FATAL_FAILURE(h.open_on(ARCPOOL_DRIVER_NULL));
  EXPECT_OK(arcpool_deallocate_async(h.a, h.from, 0));
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  void* p = nullptr;
  bool threw = false;
  t_refuse_any_caller = true;
  g_throwing_news.to_fail = 1000;
  try {
    status = arcpool_allocation_data(h.a, &p);
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  g_throwing_news.to_fail = 0;
  t_refuse_any_caller = false;
  EXPECT_FALSE(threw) << "std::bad_alloc left arcpool_allocation_data";
  EXPECT_EQ(ARCPOOL_STATUS_ALREADY_DEALLOCATED, status) << arcpool_last_error();
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "already deallocated"))
      << arcpool_last_error();
  arcpool_allocation_release(h.a);
  h.destroy();
}

TEST(HostMemoryExhaustion, ADiscardAndReleaseRefusedItsFreeStillReleasesTheHandle) {
  // The last owner's discard succeeds, and its deallocation (deferred: a use record of another
  // stream) is refused for host memory. The handle's reference goes whatever the status
  // (arcpool_allocation_discard_and_release): the caller may not use the handle again, so a
  // kept reference would keep the UNOWNED allocation, and its memory, for ever.
  handoff h;
  ASSERT_NO_FATAL_FAILURE(h.open_on(ARCPOOL_DRIVER_NULL));
  EXPECT_OK(arcpool_record_use(h.a, h.to));
  arcpool_allocation_t* const observer = h.a;
  EXPECT_OK(arcpool_allocation_retain(observer));
  const int failed_before = g_throwing_news.failed.load();
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_allocation_discard_and_release(h.a);
  g_throwing_news.to_fail = 0;
  EXPECT_LT(failed_before, g_throwing_news.failed.load()) << "nothing was refused";
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
  arcpool_allocation_info_t info;
  info.struct_size = sizeof(info);
  info.version = ARCPOOL_ALLOCATION_INFO_VERSION;
  ASSERT_OK(arcpool_allocation_info(observer, &info));
  EXPECT_EQ(ARCPOOL_ALLOCATION_UNOWNED, info.state);
  EXPECT_EQ(1u, info.references) << "the released handle's reference was kept";
  arcpool_allocation_release(observer);  // the last reference: the free is made now
  const arcpool_stats_t st = stats_of(h.alloc);
  EXPECT_EQ(0u, st.allocations_in_use_current);
  EXPECT_EQ(0u, st.reclaim_failures);
  h.destroy();
}

TEST(HostMemoryExhaustion, AFreeDeferredToAGraphsEndFencesItsStreamsWithoutHostMemory) {
  // A free during a capture, of an allocation that five more streams of the capture use: once
  // the graph is gone, the reclaim worker fences the six streams (a fence list keeps four
  // inline), with every throwing allocation of arcpool's refused meanwhile. The free completes.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_CUDA);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
  std::vector<arcpool_stream_t> users(5);
  for (arcpool_stream_t& u : users) {
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &u)) << arcpool_last_error();
  }
  const auto cu = [](arcpool_stream_t x) { return reinterpret_cast<cudaStream_t>(x); };
  const auto edge = [&](arcpool_stream_t from, arcpool_stream_t to) {
    cudaEvent_t e = nullptr;
    ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ASSERT_EQ(cudaSuccess, cudaEventRecord(e, cu(from)));
    ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(cu(to), e, 0));
    EXPECT_EQ(cudaSuccess, cudaEventDestroy(e));
  };
  arcpool_allocation_t* a = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a))
      << arcpool_last_error();
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(cu(s), cudaStreamCaptureModeThreadLocal));
  for (arcpool_stream_t u : users) {
    ASSERT_NO_FATAL_FAILURE(edge(s, u));  // the capture forks to u
    EXPECT_OK(arcpool_record_use(a, u));
  }
  EXPECT_OK(arcpool_deallocate_async(a, s, 0));  // deferred to the graph's end
  arcpool_allocation_release(a);
  for (arcpool_stream_t u : users)
    ASSERT_NO_FATAL_FAILURE(edge(u, s));  // joins
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(cu(s), &graph));
  EXPECT_EQ(1u, stats_of(alloc).graph_deferred_frees);

  // The block is held until the free runs (the stream caches hold none: s's free waited).
  const auto held = [&] {
    const arcpool_stats_t st = stats_of(alloc);
    return st.bytes_held_current - st.bytes_cached_current;
  };
  EXPECT_EQ(kBytes, held());
  g_throwing_news.to_fail = 1000;
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));  // the worker takes the free
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (held() != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  g_throwing_news.to_fail = 0;
  EXPECT_EQ(0u, held()) << "the free did not complete";
  const arcpool_stats_t st = stats_of(alloc);
  EXPECT_EQ(0u, st.reclaim_failures);
  EXPECT_EQ(0u, st.allocations_in_use_current);
  for (arcpool_stream_t u : users)
    EXPECT_OK(arcpool_stream_destroy(alloc, u));
  EXPECT_OK(arcpool_stream_destroy(alloc, s));
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, AStreamWhoseEntryTheHostHasNoMemoryForIsDestroyedAgain) {
  // arcpool_stream_create makes the CUDA stream, then its entry: refused the entry, it fails
  // with OUT_OF_MEMORY and destroys the stream it made. Counted with simcuda's call counters.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  if (!arcpool::test::on_simcuda()) GTEST_SKIP() << "counts the streams with simcuda's counters";
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_CUDA);
  ASSERT_NE(nullptr, alloc);
  const uint64_t created = arcpool::test::simcuda_calls("cudaStreamCreateWithFlags");
  const uint64_t destroyed = arcpool::test::simcuda_calls("cudaStreamDestroy");
  arcpool_stream_t s = nullptr;
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_stream_create(alloc, &s);
  g_throwing_news.to_fail = 0;
  EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
  EXPECT_EQ(nullptr, s);
  const uint64_t made = arcpool::test::simcuda_calls("cudaStreamCreateWithFlags") - created;
  EXPECT_EQ(1u, made) << "no stream was made: the test proves nothing";
  EXPECT_EQ(made, arcpool::test::simcuda_calls("cudaStreamDestroy") - destroyed)
      << "the stream made for the refused entry was not destroyed";
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, AnAllocatorThatCannotBeMadeDestroysThePoolItMade) {
  // arcpool_allocator_create makes its owned pool, then the driver that holds it and the
  // allocator around it: refused any of those, each attempt fails with OUT_OF_MEMORY and
  // destroys the pool it made. Counted with simcuda's call counters.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  if (!arcpool::test::on_simcuda()) GTEST_SKIP() << "counts the pools with simcuda's counters";
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_CUDA;
  arcpool_allocator_t* alloc = nullptr;
  uint64_t created = arcpool::test::simcuda_calls("cudaMemPoolCreate");
  uint64_t destroyed = arcpool::test::simcuda_calls("cudaMemPoolDestroy");
  ASSERT_NO_FATAL_FAILURE(expect_refused_calls_change_nothing(
      "creating an allocator", [&] { return arcpool_allocator_create(&options, &alloc); },
      [&](int passed) {
        EXPECT_EQ(nullptr, alloc);
        const uint64_t made = arcpool::test::simcuda_calls("cudaMemPoolCreate") - created;
        EXPECT_EQ(made, arcpool::test::simcuda_calls("cudaMemPoolDestroy") - destroyed)
            << "a creation refused after " << passed << " allocations kept its pool";
        created = arcpool::test::simcuda_calls("cudaMemPoolCreate");
        destroyed = arcpool::test::simcuda_calls("cudaMemPoolDestroy");
      }));
  ASSERT_NE(nullptr, alloc);
  arcpool_allocator_destroy(alloc);
}

TEST(HostMemoryExhaustion, ADefaultAllocatorTheTableHasNoRoomForKeepsNoReference) {
  // arcpool_default_allocator_set takes a reference to the allocator for the table: refused
  // the table's room (the device's slot, the list of retired allocators), each attempt fails
  // with OUT_OF_MEMORY and keeps no reference, so that the allocator, replaced and destroyed
  // at the end, destroys its pool. Counted with simcuda's call counters.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  if (!arcpool::test::on_simcuda()) GTEST_SKIP() << "counts the pools with simcuda's counters";
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_CUDA);
  ASSERT_NE(nullptr, alloc);
  ASSERT_NO_FATAL_FAILURE(expect_refused_calls_change_nothing(
      "setting the default allocator", [&] { return arcpool_default_allocator_set(0, alloc); },
      [](int) {}));  // what a refusal changed shows at the end: the pool goes with the handle
  EXPECT_OK(arcpool_default_allocator_set(0, nullptr));
  const uint64_t destroyed = arcpool::test::simcuda_calls("cudaMemPoolDestroy");
  arcpool_allocator_destroy(alloc);
  EXPECT_EQ(destroyed + 1, arcpool::test::simcuda_calls("cudaMemPoolDestroy"))
      << "the allocator outlived its last handle: a refused attempt kept its reference";
}

// --- Pool memory shared with another process (design.md §14) --------------------------------

/// The exporting process of an IPC test: an exporting allocator, a stream, and (start) an
/// exporter joined to a child running `role`. Ends the child if the test did not.
struct exporting_side {
  arcpool::test::child c;
  arcpool_allocator_t* alloc = nullptr;
  arcpool_stream_t s = nullptr;
  arcpool_ipc_exporter_t* e = nullptr;

  /// Spawns the child and makes the allocator and the stream (not the exporter).
  void spawn(const char* role) {
    c = arcpool::test::spawn_child(role);
    alloc = allocator_on(ARCPOOL_DRIVER_CUDA, cudaMemHandleTypePosixFileDescriptor);
    ASSERT_NE(nullptr, alloc);
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
  }
  /// spawn, and the exporter.
  void start(const char* role) {
    ASSERT_NO_FATAL_FAILURE(spawn(role));
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_ipc_exporter_create(alloc, c.socket, &e))
        << arcpool_last_error();
  }
  /// Sends a new allocation, whose only claim is then the exporter's.
  void send_one() {
    arcpool_allocation_t* h = nullptr;
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(alloc, kBytes, 0, s, 0, &h))
        << arcpool_last_error();
    EXPECT_OK(arcpool_ipc_send(e, h));
    EXPECT_OK(arcpool_allocation_discard_and_release(h));
  }
  /// Tells the child to go on, and expects it to exit cleanly.
  void let_child_exit() {
    ASSERT_EQ(1, write(c.pipe, "x", 1));
    const int status = arcpool::test::reap(std::exchange(c.pid, -1));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child wait status " << status;
  }
  ~exporting_side() {
    if (c.pid > 0) {
      kill(c.pid, SIGKILL);
      arcpool::test::reap(c.pid);
    }
    if (e != nullptr) {
      arcpool_ipc_exporter_destroy(e);
    } else if (c.socket >= 0) {
      close(c.socket);  // no exporter took it
    }
    if (s != nullptr) {
      EXPECT_OK(arcpool_stream_synchronize(alloc, s));
      EXPECT_OK(arcpool_stream_destroy(alloc, s));
    }
    arcpool_allocator_destroy(alloc);
    if (c.pipe >= 0) close(c.pipe);
  }
};

TEST(HostMemoryExhaustion, AnIpcSendTheHostHasNoMemoryToRecordKeepsNoClaim) {
  // arcpool_ipc_send takes a claim for the importer, then records the allocation sent: refused
  // the record (or anything before it), each attempt fails with OUT_OF_MEMORY and keeps no
  // claim, so that the allocation is freed once the claim of the send that succeeded goes with
  // the importer, which never receives it.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  exporting_side x;
  ASSERT_NO_FATAL_FAILURE(x.start("ImporterConnectsAndWaits"));
  ASSERT_EQ('c', arcpool::test::read_report(x.c.pipe));
  arcpool_allocation_t* h = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(x.alloc, kBytes, 0, x.s, 0, &h))
      << arcpool_last_error();
  ASSERT_NO_FATAL_FAILURE(expect_refused_calls_change_nothing(
      "the send", [&] { return arcpool_ipc_send(x.e, h); },
      [&](int) {
        EXPECT_EQ(0u, arcpool::test::outstanding(x.e)) << "a refused send was recorded";
      }));
  EXPECT_OK(arcpool_allocation_discard_and_release(h));  // the sent claim is the last
  x.let_child_exit();
  EXPECT_TRUE(arcpool::test::eventually([&] { return arcpool::test::outstanding(x.e) == 0; }));
  EXPECT_OK(arcpool_stream_synchronize(x.alloc, x.s));
  EXPECT_TRUE(arcpool::test::eventually([&] {
    const arcpool_stats_t st = stats_of(x.alloc);
    return st.bytes_in_use_current + st.bytes_pending_free_current == 0;
  })) << "the allocation was never freed: a refused send kept its claim";
}

TEST(HostMemoryExhaustion, AnIpcSendRefusedWhileFencingTheUsesKeepsNoEvent) {
  // With use records on more streams than the fence list holds inline, the send allocates to
  // fence them after it took its interprocess event: refused there, it gives the event back, so
  // that every attempt reuses the one event (it was lost, and each attempt made another). Each
  // attempt lets one more of this thread's allocations through and refuses all the later ones
  // (an event pool's reservation takes a refusal without failing). Counted with simcuda's call
  // counters.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  if (!arcpool::test::on_simcuda()) GTEST_SKIP() << "counts the events with simcuda's counters";
  auto events_alive = [] {
    return arcpool::test::simcuda_calls("cudaEventCreateWithFlags") -
           arcpool::test::simcuda_calls("cudaEventDestroy");
  };
  const uint64_t alive_before = events_alive();
  exporting_side x;
  ASSERT_NO_FATAL_FAILURE(x.start("ImporterConnectsAndWaits"));
  ASSERT_EQ('c', arcpool::test::read_report(x.c.pipe));
  arcpool_allocation_t* h = nullptr;
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_allocate_async(x.alloc, kBytes, 0, x.s, 0, &h))
      << arcpool_last_error();
  arcpool_stream_t users[6] = {};
  for (arcpool_stream_t& u : users) {
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(x.alloc, &u)) << arcpool_last_error();
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_record_use(h, u)) << arcpool_last_error();
  }
  int refusals = 0;
  for (int passed = 0;; ++passed) {
    ASSERT_LT(passed, 100) << "the send kept failing";
    arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
    {
      refusing_this_thread_only only_here;
      g_throwing_news.to_pass = passed;
      g_throwing_news.to_fail = 1000;
      status = arcpool_ipc_send(x.e, h);
      g_throwing_news.to_fail = 0;
      g_throwing_news.to_pass = 0;
    }
    if (status == ARCPOOL_STATUS_SUCCESS) break;
    ASSERT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
    EXPECT_EQ(0u, arcpool::test::outstanding(x.e)) << "a refused send was recorded";
    ++refusals;
  }
  EXPECT_LT(0, refusals) << "no attempt was refused: the test proves nothing";
  EXPECT_OK(arcpool_allocation_discard_and_release(h));
  x.let_child_exit();
  EXPECT_TRUE(arcpool::test::eventually([&] { return arcpool::test::outstanding(x.e) == 0; }));
  for (arcpool_stream_t u : users)
    EXPECT_OK(arcpool_stream_destroy(x.alloc, u));
  arcpool_ipc_exporter_destroy(std::exchange(x.e, nullptr));
  x.c.socket = -1;  // the exporter's, closed with it
  EXPECT_OK(arcpool_stream_synchronize(x.alloc, x.s));
  EXPECT_OK(arcpool_stream_destroy(x.alloc, std::exchange(x.s, nullptr)));
  arcpool_allocator_destroy(std::exchange(x.alloc, nullptr));
  EXPECT_TRUE(arcpool::test::eventually([&] { return events_alive() == alive_before; }))
      << events_alive() - alive_before << " events never destroyed: a refused send kept one";
}

TEST(HostMemoryExhaustion, AnIpcExporterRefusedItsWatchersThreadFailsAndKeepsNothing) {
  // arcpool_ipc_exporter_create starts a thread to watch the importer once it greeted it:
  // refused the thread's state (std::bad_alloc, not std::system_error), it fails with
  // OUT_OF_MEMORY, gives the socket back and keeps no reference to the allocator, whose pool
  // goes with its last handle. Attempts refused before the greeting was read leave it in the
  // socket. Counted with simcuda's call counters.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  if (!arcpool::test::on_simcuda()) GTEST_SKIP() << "counts the pools with simcuda's counters";
  exporting_side x;
  ASSERT_NO_FATAL_FAILURE(x.spawn("ImporterConnectsAndWaits"));
  pollfd greeting{x.c.socket, POLLIN, 0};
  ASSERT_EQ(1, poll(&greeting, 1, 20000)) << "the importer did not greet";
  auto greeting_unread = [&] {
    char byte = 0;
    return recv(x.c.socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 1;
  };
  for (int passed = 0; greeting_unread(); ++passed) {
    ASSERT_LT(passed, 100) << "the exporter's creation kept failing before the greeting";
    g_throwing_news.to_pass = passed;
    g_throwing_news.to_fail = 1;
    const arcpool_status_t status = arcpool_ipc_exporter_create(x.alloc, x.c.socket, &x.e);
    g_throwing_news.to_fail = 0;
    g_throwing_news.to_pass = 0;
    ASSERT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status)
        << "no refusal landed after the greeting: " << arcpool_last_error();
    ASSERT_EQ(nullptr, x.e);
  }
  EXPECT_NE(std::string::npos, std::string(arcpool_last_error()).find("watcher"))
      << arcpool_last_error();
  ASSERT_EQ('c', arcpool::test::read_report(x.c.pipe));  // the importer got the pool
  x.let_child_exit();
  EXPECT_OK(arcpool_stream_synchronize(x.alloc, x.s));
  EXPECT_OK(arcpool_stream_destroy(x.alloc, std::exchange(x.s, nullptr)));
  const uint64_t destroyed = arcpool::test::simcuda_calls("cudaMemPoolDestroy");
  arcpool_allocator_destroy(std::exchange(x.alloc, nullptr));
  EXPECT_EQ(destroyed + 1, arcpool::test::simcuda_calls("cudaMemPoolDestroy"))
      << "the allocator outlived its last handle: the refused exporter kept its reference";
}

TEST(HostMemoryExhaustion, AnIpcExporterDropsADeadImportersClaimsWithoutHostMemory) {
  // Once the importer's process is gone, the watcher drops the claims it held, one at a time:
  // with every host allocation of arcpool's refused, it allocates nothing for them (the
  // events go back to their pool, or are destroyed when it cannot grow).
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  exporting_side x;
  ASSERT_NO_FATAL_FAILURE(x.start("ImporterReceivesAndHolds"));
  ASSERT_NO_FATAL_FAILURE(x.send_one());
  ASSERT_EQ('h', arcpool::test::read_report(x.c.pipe));
  EXPECT_EQ(1u, arcpool::test::outstanding(x.e));
  g_throwing_news.to_fail = 1000000;
  ASSERT_EQ(0, kill(x.c.pid, SIGKILL));
  EXPECT_TRUE(arcpool::test::eventually([&] { return arcpool::test::outstanding(x.e) == 0; }))
      << "the dead importer's claim was not dropped";
  g_throwing_news.to_fail = 0;
  const int status = arcpool::test::reap(std::exchange(x.c.pid, -1));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

TEST(HostMemoryExhaustion, AnIpcImporterReleasesWithoutHostMemory) {
  // An importer's release reads what the exporter sent meanwhile: here the acknowledgement of
  // an earlier release (its event goes back to the importer's pool) and 40 more allocations
  // (queued for later receives), then keeps its own event for the acknowledgement to come.
  // With every host allocation of arcpool's refused in the importer, the release allocates
  // nothing it cannot do without: an allocation it cannot queue is refused to the exporter,
  // whose claim goes; an event it cannot keep is destroyed, or left to the process's exit.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  exporting_side x;
  ASSERT_NO_FATAL_FAILURE(x.start("ImporterReleasesWithoutHostMemory"));
  ASSERT_NO_FATAL_FAILURE(x.send_one());
  ASSERT_NO_FATAL_FAILURE(x.send_one());
  ASSERT_EQ('a', arcpool::test::read_report(x.c.pipe)) << "the importer released nothing";
  ASSERT_TRUE(arcpool::test::eventually([&] { return arcpool::test::outstanding(x.e) == 1; }));
  constexpr size_t kQueued = 40;
  for (size_t i = 0; i < kQueued; ++i)
    ASSERT_NO_FATAL_FAILURE(x.send_one());
  ASSERT_EQ(1, write(x.c.pipe, "x", 1));  // the importer releases the second without memory
  ASSERT_EQ('b', arcpool::test::read_report(x.c.pipe))
      << "the importer did not survive its release without host memory";
  EXPECT_TRUE(arcpool::test::eventually([&] { return arcpool::test::outstanding(x.e) < kQueued; }))
      << "no allocation the importer could not queue was refused to the exporter";
  x.let_child_exit();
  EXPECT_TRUE(arcpool::test::eventually([&] { return arcpool::test::outstanding(x.e) == 0; }));
}

// --- The importing processes ----------------------------------------------------------------

/// An importing process's allocator, stream and importer, on the test process's socket.
struct importing_side {
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_CUDA);
  arcpool_stream_t s = nullptr;
  arcpool_ipc_importer_t* im = nullptr;

  void connect() {
    ASSERT_NE(nullptr, alloc);
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS,
              arcpool_ipc_importer_create(alloc, arcpool::test::env_fd("ARCPOOL_IPC_SOCKET"), &im))
        << arcpool_last_error();
  }
  arcpool_allocation_t* receive() {
    arcpool_allocation_t* h = nullptr;
    EXPECT_OK(arcpool_ipc_receive(im, s, &h));
    return h;
  }
  ~importing_side() {
    arcpool_ipc_importer_destroy(im);
    if (s != nullptr) {
      EXPECT_OK(arcpool_stream_synchronize(alloc, s));
      EXPECT_OK(arcpool_stream_destroy(alloc, s));
    }
    arcpool_allocator_destroy(alloc);
  }
};

/// Host work that holds a stream for 200 ms.
void hold_stream(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

TEST(IpcChild, DISABLED_ImporterConnectsAndWaits) {
  importing_side side;
  ASSERT_NO_FATAL_FAILURE(side.connect());
  arcpool::test::report('c');
  arcpool::test::wait_for_parent();
}

TEST(IpcChild, DISABLED_ImporterReceivesAndHolds) {
  importing_side side;
  ASSERT_NO_FATAL_FAILURE(side.connect());
  ASSERT_NE(nullptr, side.receive());
  arcpool::test::report('h');
  for (;;) {
    pause();  // until killed
  }
}

TEST(IpcChild, DISABLED_ImporterReleasesWithoutHostMemory) {
  importing_side side;
  ASSERT_NO_FATAL_FAILURE(side.connect());
  arcpool_allocation_t* first = side.receive();
  arcpool_allocation_t* second = side.receive();
  ASSERT_NE(nullptr, first);
  ASSERT_NE(nullptr, second);
  EXPECT_OK(arcpool_allocation_discard_and_release(first));
  EXPECT_OK(arcpool_allocator_trim(side.alloc, 0));  // completes the reclaim: released
  arcpool::test::report('a');
  arcpool::test::wait_for_parent();  // acknowledged, and 40 more sent
  // The second's free waits 200 ms for the stream: its release runs with the refusals on.
  EXPECT_OK(arcpool_stream_launch_host_func(side.alloc, side.s, &hold_stream, nullptr));
  EXPECT_OK(arcpool_allocation_discard_and_release(second));
  g_throwing_news.to_fail = 1000000;
  arcpool_allocator_trim(side.alloc, 0);  // may fail for host memory: the worker releases it
  arcpool::test::report('b');
  arcpool::test::wait_for_parent();  // the exporter saw the release and the refusals
  g_throwing_news.to_fail = 0;
}

TEST(HostMemoryExhaustion, AFreeTheReclaimWorkerHasNoHostMemoryForIsCountedNotFatal) {
  // A deferred free, completed on the reclaim worker once its fences did: on the host driver
  // its wait and its free queue work on a host stream, which allocates. Refused, the free is
  // written off and counted in reclaim_failures, as a failed CUDA call's is; the worker goes on.
  arcpool_allocator_t* alloc = allocator_on(ARCPOOL_DRIVER_HOST);
  ASSERT_NE(nullptr, alloc);
  arcpool_stream_t s = nullptr, t = nullptr;
  ASSERT_OK(arcpool_stream_create(alloc, &s));
  ASSERT_OK(arcpool_stream_create(alloc, &t));
  arcpool_allocation_t* a = nullptr;
  {
#if defined(__SANITIZE_ADDRESS__)
    __lsan::ScopedDisabler leaks_expected;  // the refused free writes the block off
#endif
    ASSERT_OK(arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a));
  }
  // The free waits for the stream, held until the refusals are on: the worker completes it
  // with them.
  std::atomic<bool> go{false};
  ASSERT_OK(arcpool_stream_launch_host_func(
      alloc, s,
      [](void* flag) {
        while (!static_cast<std::atomic<bool>*>(flag)->load())
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      &go));
  ASSERT_OK(arcpool_deallocate_async(a, t, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  ASSERT_OK(arcpool_allocation_release(a));
  const uint64_t failures = stats_of(alloc).reclaim_failures;
  g_throwing_news.to_fail = 1000000;
  go = true;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stats_of(alloc).reclaim_failures == failures && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  g_throwing_news.to_fail = 0;
  EXPECT_EQ(failures + 1, stats_of(alloc).reclaim_failures) << "the free was not refused";
  // The worker still frees what it can.
  ASSERT_OK(arcpool_allocate_async(alloc, kBytes, 0, s, 0, &a));
  ASSERT_OK(arcpool_deallocate_async(a, t, ARCPOOL_DEALLOCATE_FLAG_DEFERRED));
  ASSERT_OK(arcpool_allocation_release(a));
  EXPECT_OK(arcpool_allocator_trim(alloc, 0));
  EXPECT_EQ(0u, stats_of(alloc).bytes_pending_free_current);
  EXPECT_EQ(failures + 1, stats_of(alloc).reclaim_failures);
  EXPECT_OK(arcpool_stream_destroy(alloc, t));
  EXPECT_OK(arcpool_stream_destroy(alloc, s));
  arcpool_allocator_destroy(alloc);
}

/// An allocator on the CUDA driver (graph pools need it: it builds graphs), a stream of its
/// own, and a graph pool that the stream's captures are bound to.
struct graph_pool_stream {
  arcpool_allocator_t* alloc = nullptr;
  arcpool_stream_t s = nullptr;
  arcpool_graph_pool_t* pool = nullptr;

  cudaStream_t cu() const { return reinterpret_cast<cudaStream_t>(s); }
  void open() {
    alloc = allocator_on(ARCPOOL_DRIVER_CUDA);
    ASSERT_NE(nullptr, alloc);
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc, &s)) << arcpool_last_error();
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_graph_pool_create(alloc, &pool))
        << arcpool_last_error();
  }
  /// Begins a capture on the stream, bound to the pool.
  void begin() {
    ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(cu(), cudaStreamCaptureModeThreadLocal));
    ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, arcpool_graph_pool_begin(pool, s)) << arcpool_last_error();
  }
  /// Ends the capture and its binding, and destroys the graph.
  void end() {
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(cu(), &graph));
    EXPECT_OK(arcpool_graph_pool_end(pool, s));
    EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  }
  /// Releases the pool and expects every block of it back in the allocator's pool (the reclaim
  /// worker frees them: within 10 s), then destroys the stream and the allocator.
  void close() {
    arcpool_graph_pool_release(pool);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (stats_of(alloc).graph_pool_bytes_current != 0 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(0u, stats_of(alloc).graph_pool_bytes_current) << "a graph pool's block was lost";
    EXPECT_OK(arcpool_stream_synchronize(alloc, s));
    EXPECT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);
  }
};

TEST(HostMemoryExhaustion, AGraphPoolsBlockFreedWithoutHostMemoryGoesBackToThePool) {
  // Freed outside every capture, a block lent by a graph pool goes back to the pool's free
  // list, whose room was made when it was lent: the free needs no host memory.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  graph_pool_stream g;
  ASSERT_NO_FATAL_FAILURE(g.open());
  ASSERT_NO_FATAL_FAILURE(g.begin());
  arcpool_allocation_t* a = nullptr;
  EXPECT_OK(arcpool_allocate_async(g.alloc, kBytes, 0, g.s, 0, &a));
  ASSERT_NO_FATAL_FAILURE(g.end());
  ASSERT_NE(nullptr, a);
  g_throwing_news.to_fail = 1000;
  const arcpool_status_t status = arcpool_deallocate_async(a, g.s, 0);
  g_throwing_news.to_fail = 0;
  EXPECT_EQ(ARCPOOL_STATUS_SUCCESS, status) << arcpool_last_error();
  if (status != ARCPOOL_STATUS_SUCCESS) {
    EXPECT_EQ(1, arcpool_allocation_is_terminal(a)) << "a failed deallocation changed it";
    EXPECT_OK(arcpool_deallocate_async(a, g.s, 0));
  }
  arcpool_allocation_release(a);
  g.close();
}

TEST(HostMemoryExhaustion, AGraphAllocationWhoseRecordCannotBeMadeGivesItsBlockBack) {
  // In a capture bound to a graph pool, attempts to allocate with one of arcpool's throwing
  // allocations refused after `p` and one of its nothrow ones (such as the allocation's record)
  // after `q`: each attempt fails or succeeds, and a block that a failed attempt took goes back
  // to the pool, which releases it at its end. Each attempt runs on a thread of its own, whose
  // record list is empty, so that its record comes from the heap.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  graph_pool_stream g;
  ASSERT_NO_FATAL_FAILURE(g.open());
  ASSERT_NO_FATAL_FAILURE(g.begin());
  // Attempts that failed with only a nothrow allocation refused: every throwing one they made
  // was let through, so that `p` reaches past them (a return that pushed would be refused).
  int only_nothrow_refused = 0;
  for (int p = 0; p < 16; ++p) {
    for (int q = 0; q < 3; ++q) {
      std::thread([&] {
        const int throwing_before = g_throwing_news.failed.load();
        const int scalar_before = g_scalar_news.failed.load();
        g_throwing_news.to_pass = p;
        g_throwing_news.to_fail = 1;
        g_scalar_news.to_pass = q;
        g_scalar_news.to_fail = 1;
        arcpool_allocation_t* a = nullptr;
        const arcpool_status_t status = arcpool_allocate_async(g.alloc, kBytes, 0, g.s, 0, &a);
        g_throwing_news.to_fail = 0;
        g_throwing_news.to_pass = 0;
        g_scalar_news.to_fail = 0;
        g_scalar_news.to_pass = 0;
        if (status == ARCPOOL_STATUS_SUCCESS) {
          EXPECT_OK(arcpool_deallocate_async(a, g.s, 0));
          arcpool_allocation_release(a);
          return;
        }
        EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
        EXPECT_EQ(nullptr, a);
        if (g_throwing_news.failed.load() == throwing_before &&
            g_scalar_news.failed.load() != scalar_before) {
          ++only_nothrow_refused;
        }
      }).join();
    }
  }
  EXPECT_LT(0, only_nothrow_refused) << "no attempt got past every throwing allocation to a "
                                        "refused nothrow one: the test proves nothing";
  ASSERT_NO_FATAL_FAILURE(g.end());
  g.close();
}

TEST(HostMemoryExhaustion, ABlockAnAllocationWithoutARecordGaveBackKeepsItsBranch) {
  // Freed on the capture's first stream, a graph pool's block is lent again only on that
  // stream: another branch of the graph, not joined to it, is not ordered after the free. An
  // allocation on the first stream that takes the block and is refused its record gives the
  // block back under the same rule, so that the unjoined branch still gets another block.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  graph_pool_stream g;
  ASSERT_NO_FATAL_FAILURE(g.open());
  arcpool_stream_t branch = nullptr;
  ASSERT_OK(arcpool_stream_create(g.alloc, &branch));
  cudaStream_t const branch_cu = reinterpret_cast<cudaStream_t>(branch);
  cudaEvent_t fork = nullptr, join = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  ASSERT_NO_FATAL_FAILURE(g.begin());
  ASSERT_EQ(cudaSuccess, cudaEventRecord(fork, g.cu()));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(branch_cu, fork, 0));
  arcpool_allocation_t* a = nullptr;
  ASSERT_OK(arcpool_allocate_async(g.alloc, kBytes, 0, g.s, 0, &a));
  void* const block = data_of(a);
  ASSERT_OK(arcpool_deallocate_async(a, g.s, 0));
  arcpool_allocation_release(a);
  // On a thread of its own, whose record list is empty: its record comes from the heap, and
  // each attempt refuses one more of its nothrow allocations until one is refused the record.
  bool refused = false;
  for (int q = 0; q < 3 && !refused && !HasFailure(); ++q) {
    std::thread([&] {
      g_scalar_news.to_pass = q;
      g_scalar_news.to_fail = 1;
      arcpool_allocation_t* b = nullptr;
      const arcpool_status_t status = arcpool_allocate_async(g.alloc, kBytes, 0, g.s, 0, &b);
      g_scalar_news.to_fail = 0;
      g_scalar_news.to_pass = 0;
      if (status == ARCPOOL_STATUS_SUCCESS) {  // the refusal came past the record: free it again
        EXPECT_OK(arcpool_deallocate_async(b, g.s, 0));
        arcpool_allocation_release(b);
        return;
      }
      EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
      refused = true;
    }).join();
  }
  ASSERT_TRUE(refused) << "no attempt was refused its record: the test proves nothing";
  arcpool_allocation_t* other = nullptr;
  ASSERT_OK(arcpool_allocate_async(g.alloc, kBytes, 0, branch, 0, &other));
  EXPECT_NE(block, data_of(other))
      << "the unjoined branch was lent the block freed on the other stream";
  ASSERT_OK(arcpool_deallocate_async(other, branch, 0));
  arcpool_allocation_release(other);
  ASSERT_EQ(cudaSuccess, cudaEventRecord(join, branch_cu));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(g.cu(), join, 0));
  ASSERT_NO_FATAL_FAILURE(g.end());
  EXPECT_EQ(cudaSuccess, cudaEventDestroy(fork));
  EXPECT_EQ(cudaSuccess, cudaEventDestroy(join));
  EXPECT_OK(arcpool_stream_destroy(g.alloc, branch));
  g.close();
}

TEST(HostMemoryExhaustion, ABindingRefusedItsGateKeepsTheNoticeAFreeInTheCaptureGaveThePool) {
  // A block freed in a capture bound to no pool waits for that graph: the pool was told of its
  // end. A binding of that capture to the pool, refused the user object of its own notice,
  // takes back only that notice: the block still waits, and another capture is not lent it.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  graph_pool_stream g;
  ASSERT_NO_FATAL_FAILURE(g.open());
  ASSERT_NO_FATAL_FAILURE(g.begin());
  arcpool_allocation_t* out = nullptr;
  ASSERT_OK(arcpool_allocate_async(g.alloc, kBytes, 0, g.s, 0, &out));  // kept past the capture
  ASSERT_NO_FATAL_FAILURE(g.end());
  void* const block = data_of(out);
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(g.cu(), cudaStreamCaptureModeThreadLocal));
  ASSERT_OK(arcpool_deallocate_async(out, g.s, 0));  // in a capture bound to no pool
  arcpool_allocation_release(out);
  // Each attempt refuses one more of the binding's nothrow allocations, until one is refused
  // after its gate was made (the user object's trampoline).
  bool refused_late = false;
  for (int q = 0; q < 4 && !refused_late; ++q) {
    const int refused_before = g_scalar_news.failed.load();
    g_scalar_news.to_pass = q;
    g_scalar_news.to_fail = 1;
    const arcpool_status_t status = arcpool_graph_pool_begin(g.pool, g.s);
    g_scalar_news.to_fail = 0;
    g_scalar_news.to_pass = 0;
    ASSERT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status)
        << "attempt " << q << ": " << arcpool_last_error();
    ASSERT_EQ(refused_before + 1, g_scalar_news.failed.load());
    refused_late = q > 0;
  }
  arcpool_stream_t t = nullptr;
  ASSERT_OK(arcpool_stream_create(g.alloc, &t));
  const auto t_cu = reinterpret_cast<cudaStream_t>(t);
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(t_cu, cudaStreamCaptureModeThreadLocal));
  ASSERT_OK(arcpool_graph_pool_begin(g.pool, t));
  arcpool_allocation_t* other = nullptr;
  ASSERT_OK(arcpool_allocate_async(g.alloc, kBytes, 0, t, 0, &other));
  EXPECT_NE(block, data_of(other)) << "lent while the graph it was freed in lives";
  EXPECT_OK(arcpool_deallocate_async(other, t, 0));
  arcpool_allocation_release(other);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(t_cu, &graph));
  EXPECT_OK(arcpool_graph_pool_end(g.pool, t));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(g.cu(), &graph));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  EXPECT_OK(arcpool_stream_destroy(g.alloc, t));
  g.close();
}

TEST(HostMemoryExhaustion, AGraphPoolsBindingTheHostHasNoMemoryForFailsAndChangesNothing) {
  // Each attempt, on an allocator of its own (so that nothing an earlier attempt made is there
  // already), binds a capture to a new pool, letting one more of arcpool's throwing allocations
  // through before it refuses the next. A refused binding leaves the capture unbound (its
  // allocations are graph allocations, not the pool's blocks) and takes no reference of the
  // pool, which gives its blocks back at its release.
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  int refusals = 0;
  for (int passed = 0;; ++passed) {
    ASSERT_LT(passed, 100) << "the binding kept failing";
    graph_pool_stream g;
    ASSERT_NO_FATAL_FAILURE(g.open());
    ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(g.cu(), cudaStreamCaptureModeThreadLocal));
    const int failed_before = g_throwing_news.failed.load();
    g_throwing_news.to_pass = passed;
    g_throwing_news.to_fail = 1;
    const arcpool_status_t status = arcpool_graph_pool_begin(g.pool, g.s);
    g_throwing_news.to_fail = 0;
    g_throwing_news.to_pass = 0;
    if (status != ARCPOOL_STATUS_SUCCESS) {
      EXPECT_EQ(ARCPOOL_STATUS_OUT_OF_MEMORY, status) << arcpool_last_error();
      EXPECT_EQ(failed_before + 1, g_throwing_news.failed.load()) << "failed without a refusal";
      ++refusals;
    }
    arcpool_allocation_t* a = nullptr;
    EXPECT_OK(arcpool_allocate_async(g.alloc, kBytes, 0, g.s, 0, &a));
    arcpool_placement_t placement{};
    placement.struct_size = sizeof(placement);
    placement.version = ARCPOOL_PLACEMENT_VERSION;
    EXPECT_OK(arcpool_allocation_placement(a, &placement));
    EXPECT_EQ(status == ARCPOOL_STATUS_SUCCESS,
              (placement.flags & ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL) != 0)
        << (status == ARCPOOL_STATUS_SUCCESS ? "a bound capture was not lent the pool's block"
                                             : "a refused binding stayed")
        << " (refused after " << passed << " allocations)";
    EXPECT_OK(arcpool_deallocate_async(a, g.s, 0));
    arcpool_allocation_release(a);
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(g.cu(), &graph));
    if (status == ARCPOOL_STATUS_SUCCESS) {
      EXPECT_OK(arcpool_graph_pool_end(g.pool, g.s));
    }
    EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
    g.close();
    if (HasFailure() || status == ARCPOOL_STATUS_SUCCESS) break;
  }
  EXPECT_LT(0, refusals) << "no attempt was refused: the test proves nothing";
}
}  // namespace
