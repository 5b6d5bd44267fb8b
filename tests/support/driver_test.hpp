// The fixture every conformance test uses: written once, instantiated for the host and the CUDA
// driver. CUDA instances skip (with the reason) when no GPU is usable, and fail instead when
// ARCPOOL_REQUIRE_GPU=1.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include "arcpool/arcpool.h"
#include "core/allocator.hpp"
#include "support/stream_probe.hpp"

namespace arcpool::test {

/// True when ARCPOOL_REQUIRE_GPU=1: GPU tests must run, not skip.
bool gpu_required();

/// Why the CUDA driver cannot run here ("" when it can).
std::string cuda_unavailable_reason();

/// An allocator on the host driver with default options and two streams of its own, for a test
/// that stands alone because it breaks or replaces its allocator (a sticky error, the default
/// table). The caller destroys the allocator.
struct standalone_host_allocator {
  arcpool_allocator_t* alloc = nullptr;
  arcpool_stream_t s = nullptr;
  arcpool_stream_t other = nullptr;
};
/// Makes `*out` (a fatal failure when it cannot).
void make_standalone_host_allocator(standalone_host_allocator* out);

/// Skips (or fails, when a GPU is required) unless the CUDA driver can run.
#define ARCPOOL_REQUIRE_CUDA_OR_SKIP()                                                      \
  do {                                                                                      \
    if (const std::string why = ::arcpool::test::cuda_unavailable_reason(); !why.empty()) { \
      if (::arcpool::test::gpu_required()) FAIL() << "ARCPOOL_REQUIRE_GPU=1 but " << why;   \
      GTEST_SKIP() << "CUDA driver not run: " << why;                                       \
    }                                                                                       \
  } while (0)

/// Skips a test that cannot run on the deterministic driver (it needs threads of its own, or
/// a second allocator that could not name the first one's streams), saying why.
#define ARCPOOL_SKIP_ON_DETERMINISTIC(why)                                             \
  do {                                                                                 \
    if (deterministic()) GTEST_SKIP() << "not on the deterministic driver: " << (why); \
  } while (0)

/// A status with the message arcpool_last_error() gave for it, so that a mismatch prints both.
struct status_result {
  arcpool_status_t status;
  std::string message;
  static status_result of(arcpool_status_t s) {
    return {s, s == ARCPOOL_STATUS_SUCCESS ? std::string() : std::string(arcpool_last_error())};
  }
};
inline bool operator==(arcpool_status_t expected, const status_result& got) {
  return expected == got.status;
}
inline void PrintTo(const status_result& r, std::ostream* os) {
  *os << arcpool_status_string(r.status) << " (" << r.message << ")";
}

/// Expects `expr` to return `status`; a mismatch prints the last error. Accepts `<< message`.
#define EXPECT_STATUS(status, expr) \
  EXPECT_EQ(status, ::arcpool::test::status_result::of(expr)) << #expr
/// As EXPECT_STATUS, ending the test on a mismatch.
#define ASSERT_STATUS(status, expr) \
  ASSERT_EQ(status, ::arcpool::test::status_result::of(expr)) << #expr
#define ASSERT_OK(expr) \
  ASSERT_EQ(ARCPOOL_STATUS_SUCCESS, ::arcpool::test::status_result::of(expr)) << #expr
#define EXPECT_OK(expr) EXPECT_STATUS(ARCPOOL_STATUS_SUCCESS, expr)

/// The driver a DriverTest instance runs on: the host or CUDA driver, or the host driver's
/// deterministic mode (design.md §8: a seeded scheduler and a happens-before checker). Converts
/// to the driver kind, so `options.driver = GetParam()` keeps working (HOST for deterministic).
struct driver_param {
  arcpool_driver_kind_t kind = ARCPOOL_DRIVER_HOST;
  bool deterministic = false;
  // Implicit both ways on purpose.
  driver_param(arcpool_driver_kind_t k, bool det = false) : kind(k), deterministic(det) {}
  operator arcpool_driver_kind_t() const { return kind; }
  /// "host", "cuda" or "deterministic".
  std::string name() const { return deterministic ? "deterministic" : arcpool_driver_name(kind); }
};
inline void PrintTo(const driver_param& p, std::ostream* os) {
  *os << p.name();
}
/// The deterministic instance's parameter.
inline driver_param deterministic_driver() {
  return driver_param(ARCPOOL_DRIVER_HOST, true);
}

/// Base fixture: one allocator on the parameter's driver, streams, gates and markers.
///
/// On the deterministic driver nothing runs unless the test drives it: gates are latches the
/// scheduler skips (never a blocked thread), settle() runs every stream as far as it can,
/// sync() of a stream that can never drain fails (a deadlock) instead of hanging, no reclaim
/// worker runs (deferred frees complete only in reclaim_poll_once, drains and trims), and
/// fill_async declares its write to the happens-before checker, so that a free not ordered
/// after it fails the test at teardown, whatever addresses the pool hands out. The seed is
/// ARCPOOL_TEST_SEED when set, else random and printed with every failure.
class DriverTest : public ::testing::TestWithParam<driver_param> {
 protected:
  void SetUp() override;
  void TearDown() override;

  /// Adjusts the allocator options before creation.
  virtual void customize(arcpool_allocator_options_t& options) { (void)options; }

  /// The allocator's internals (tests reach the reclaimer and the driver through it).
  detail::allocator& core() const;
  /// The host driver, threaded or deterministic: the pool's figures are exact.
  bool on_host() const { return GetParam().kind == ARCPOOL_DRIVER_HOST; }
  /// The host driver with a worker thread per stream (host_stream_find knows its streams).
  bool on_threaded_host() const { return on_host() && !GetParam().deterministic; }
  /// The deterministic host driver: no thread runs anything the test does not drive.
  bool deterministic() const { return GetParam().deterministic; }
  /// The deterministic driver's seed (0 on the other drivers).
  uint64_t seed() const { return seed_; }

  /// A stream made by arcpool_stream_create (provably alive).
  arcpool_stream_t make_stream();
  /// An application stream arcpool does not know (not registered).
  arcpool_stream_t make_app_stream();
  /// Destroys an application stream made by make_app_stream.
  void destroy_app_stream(arcpool_stream_t s);
  void sync(arcpool_stream_t s);

  /// Blocks `s` until the gate opens (a latch in queued host work, or a stream wait on memory).
  gate& block(arcpool_stream_t s);
  /// A marker set when `s` reaches this point.
  std::shared_ptr<marker> mark(arcpool_stream_t s);
  /// Lets `s` run as far as it can. Host driver: returns once `s` is idle or blocked in a wait,
  /// so a marker that is not reached then cannot be reached without further events. CUDA
  /// driver on simcuda: the same, exactly (simcuda_stream_settle); on a GPU: gives the stream
  /// 20 ms (a missing wait shows as a reached marker).
  void settle(arcpool_stream_t s);
  /// Writes `bytes` bytes of `value` at `p` in stream order (host work on the host driver,
  /// where ASan sees a write to freed memory; cudaMemsetAsync on CUDA).
  void fill_async(arcpool_stream_t s, void* p, size_t bytes, int value);

  /// Allocates, expecting success. The test releases the handle (LeakSanitizer checks).
  arcpool_allocation_t* allocate(size_t bytes, arcpool_stream_t s, uint32_t flags = 0);

  /// Expects `bytes` bytes at `p` to equal `value` (after the writers synchronized).
  void expect_filled(const void* p, size_t bytes, int value);

  /// Completes every deferred free whose fences completed, on this thread, until none is
  /// pending (fails after 60 s), then synchronizes the fixture's streams so the frees ran.
  /// Call after the streams holding the fences were synchronized.
  void finish_reclaims();

  /// Runs everything that can run without the test: synchronizes `unheld` (streams no gate
  /// holds, directly or through a wait: so every fence taken on them completed and every free
  /// queued on them ran), makes one reclaim pass on this thread (which completes any deferred
  /// free whose fences all completed, unless the worker already took it), and synchronizes
  /// `unheld` again (so the frees that pass enqueued on them ran). Afterwards a deferred free
  /// that is still pending can only be waiting for a held stream: the test then asserts what is
  /// pending (expect_pending) and what the pool holds, which tells "not done yet" from "already
  /// freed too early" (a bare `reclaim_poll_once() == 0` cannot: the worker may have freed it).
  /// A stream of `unheld` that waits for a held one fails the test (a marker it does not reach
  /// once settled) instead of hanging it in a synchronization.
  void run_unheld(std::initializer_list<arcpool_stream_t> unheld);

  /// Expects `items` deferred frees still queued on the reclaimer, `pending_bytes` of pool
  /// memory still counted as pending free, and `frees` blocks returned to the pool so far.
  void expect_pending(size_t items, uint64_t pending_bytes, uint64_t frees);

  /// One pool free arcpool enqueued (a routed, same-stream or reclaim free; not cache flushes),
  /// as the before_free hook saw it: the block and the stream it was enqueued on.
  struct enqueued_free {
    void* block;
    size_t bytes;
    arcpool_stream_t stream;
  };
  /// Every pool free enqueued so far, in order. Recorded through the allocator's before_free
  /// hook, which the fixture sets before customize() (a suite that sets its own has none).
  std::vector<enqueued_free> frees_enqueued() const;
  /// The streams the frees of `block` were enqueued on, in order, from the `since`-th free on
  /// (frees_enqueued().size() read earlier: a pool may hand the same address out again).
  std::vector<arcpool_stream_t> streams_that_freed(const void* block, size_t since = 0) const;

  /// Whether work_enqueued() can count the work queued on a stream (host drivers; not CUDA).
  bool can_count_work() const { return on_host(); }
  /// Tasks queued on `s` so far by anyone (host drivers; 0 on CUDA): a test that reads it before
  /// and after an operation proves the operation never touched `s`.
  uint64_t work_enqueued(arcpool_stream_t s) const;

  /// The placement of `a`.
  arcpool_placement_t placement(const arcpool_allocation_t* a) const;

  /// The data pointer of `a`.
  void* data(arcpool_allocation_t* a);

  arcpool_stats_t stats() const;
  /// The per-stream statistics rows (arcpool_stream_stats_list).
  std::vector<arcpool_stream_stats_t> stream_stats_rows() const;
  /// The statistics row of `s`, or the other-streams row with `other` (a failure when there is
  /// none).
  arcpool_stream_stats_t stream_stats_row(arcpool_stream_t s, bool other = false) const;
  /// Bytes the pool has handed out and not yet taken back (host: exact; frees executed).
  uint64_t pool_used() const { return stats().pool_used_bytes_current; }

  /// Reads an allocation's state.
  arcpool_allocation_info_t info(const arcpool_allocation_t* a) const;

  /// A 4 KiB allocation on `s` brought into `state` (LIVE with `owners` claims, UNOWNED,
  /// DEALLOCATED or EXPORTED). Exported memory is freed at teardown.
  arcpool_allocation_t* make_in_state(arcpool_allocation_state_t state, arcpool_stream_t s,
                                      uint32_t owners = 1);
  /// Frees exported memory the way its new owner must (cudaFreeAsync / the host pool).
  void free_exported(void* pointer, size_t bytes, arcpool_stream_t s);

  arcpool_allocator_t* alloc_ = nullptr;
  std::unique_ptr<stream_probe> probe_;

 private:
  uint64_t seed_ = 0;
  struct free_log {
    mutable std::mutex mutex;
    std::vector<enqueued_free> frees;
  };
  // Never freed (kept in a static list): the hook may run until the allocator is gone, which a
  // leaked record can delay past the fixture.
  free_log* free_log_ = nullptr;
  std::vector<arcpool_stream_t> streams_;
  std::vector<arcpool_stream_t> app_streams_;
  // Gates and markers live until teardown, after every stream drained: a CUDA marker's word
  // must stay mapped until the stream wrote it.
  std::vector<std::unique_ptr<gate>> gates_;
  std::vector<std::shared_ptr<marker>> markers_;
  struct exported_block {
    void* pointer;
    size_t bytes;
    arcpool_stream_t stream;
  };
  std::vector<exported_block> exported_;
};

/// Instantiates a DriverTest-derived suite for both drivers.
#define ARCPOOL_INSTANTIATE_FOR_DRIVERS(Suite)                                                    \
  INSTANTIATE_TEST_SUITE_P(Drivers, Suite,                                                        \
                           ::testing::Values(::arcpool::test::driver_param(ARCPOOL_DRIVER_HOST),  \
                                             ::arcpool::test::driver_param(ARCPOOL_DRIVER_CUDA)), \
                           [](const ::testing::TestParamInfo<::arcpool::test::driver_param>& i) { \
                             return i.param.name();                                               \
                           })

/// Instantiates a DriverTest-derived suite for both drivers and the deterministic host driver
/// (suites that use no host thread of their own and no host_stream_find).
#define ARCPOOL_INSTANTIATE_FOR_ALL_DRIVERS(Suite)                                                \
  INSTANTIATE_TEST_SUITE_P(Drivers, Suite,                                                        \
                           ::testing::Values(::arcpool::test::driver_param(ARCPOOL_DRIVER_HOST),  \
                                             ::arcpool::test::deterministic_driver(),             \
                                             ::arcpool::test::driver_param(ARCPOOL_DRIVER_CUDA)), \
                           [](const ::testing::TestParamInfo<::arcpool::test::driver_param>& i) { \
                             return i.param.name();                                               \
                           })

}  // namespace arcpool::test
