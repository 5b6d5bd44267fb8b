// Premature reuse, caught by contents (issue 3, design.md §12): hold the stream that still
// reads an allocation, do the operation, immediately allocate the same size on other streams
// and fill it, then release the hold: the reader must still see the original pattern. Three
// streams, as in RMM's cross-stream reuse bug. Poison mode is on, so a free that ran early also
// shows as a mismatch. On both drivers (device kernels on CUDA, host work on the host driver).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "pattern.hpp"
#include "support/driver_test.hpp"
#include "workload.hpp"

namespace arcpool::test {
namespace {

constexpr size_t kBytes = 4 << 20;

class Reuse : public DriverTest {
 protected:
  void customize(arcpool_allocator_options_t& options) override {
    if (GetParam() == ARCPOOL_DRIVER_HOST) {
      // Host work needs a host allocator to enqueue through; any one will do.
      arcpool_allocator_options_t host;
      arcpool_allocator_options_init(&host);
      host.driver = ARCPOOL_DRIVER_HOST;
      ASSERT_OK(arcpool_allocator_create(&host, &work_allocator_));
      work_ = kernels::make_host_workload(work_allocator_);
    } else {
      work_ = kernels::make_cuda_workload();
    }
    ASSERT_NE(nullptr, work_) << "no workload for this driver (kernels off)";
    options.before_free = &kernels::workload::poison_before_free;
    options.before_free_user_data = work_.get();
    options.stream_cache_bytes = size_t{64} << 20;  // the fast path reuses fastest
    options.stream_cache_max_block = kBytes;
  }

  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    origin_ = make_stream();
    user_ = make_stream();
    other_ = make_stream();
  }

  void TearDown() override {
    DriverTest::TearDown();
    work_.reset();
    arcpool_allocator_destroy(work_allocator_);
  }

  /// A filled allocation on the origin whose reader, `user_`, is held: a verify is queued on
  /// `user_` behind a gate. The caller then frees it somehow.
  arcpool_allocation_t* read_while_held(uint32_t flags = 0) {
    arcpool_allocation_t* a = allocate(kBytes, origin_, flags);
    EXPECT_OK(work_->fill(data(a), kBytes, kTag, 0, origin_));
    EXPECT_OK(work_->wait_stream(user_, origin_));
    gate_ = &block(user_);
    EXPECT_OK(work_->verify(data(a), kBytes, kTag, 0, user_));
    return a;
  }

  /// Gives a premature free every chance to land while the reader is held: one reclaim pass
  /// on this thread (a deferred free whose fence were ignored completes here), then the other
  /// streams run as far as they can.
  void let_early_frees_land() {
    core().reclaim_poll_once();
    settle(origin_);
    settle(other_);
  }

  /// Allocates the same size on the other streams, fills it at once, releases the reader and
  /// expects it saw the original contents.
  void reallocate_release_and_check() {
    let_early_frees_land();
    std::vector<arcpool_allocation_t*> fresh;
    for (arcpool_stream_t s : {other_, origin_}) {
      arcpool_allocation_t* b = allocate(kBytes, s);
      EXPECT_OK(work_->fill(data(b), kBytes, kTag + 1 + fresh.size(), 0, s));
      fresh.push_back(b);
    }
    let_early_frees_land();
    gate_->open();
    for (arcpool_stream_t s : {origin_, user_, other_})
      sync(s);
    EXPECT_EQ(0u, work_->mismatches()) << "memory still read was reused or poisoned";
    EXPECT_EQ(kBytes / 4, work_->verified_words());
    for (arcpool_allocation_t* b : fresh) {
      EXPECT_OK(arcpool_deallocate_async(b, placement(b).origin_stream, 0));
      arcpool_allocation_release(b);
    }
  }

  static constexpr uint64_t kTag = 0xA11C;
  arcpool_allocator_t* work_allocator_ = nullptr;
  std::unique_ptr<kernels::workload> work_;
  arcpool_stream_t origin_ = nullptr;
  arcpool_stream_t user_ = nullptr;
  arcpool_stream_t other_ = nullptr;
  gate* gate_ = nullptr;
};

TEST_P(Reuse, EveryRoutingStrategyWaitsForTheReader) {
  for (uint32_t flag : {uint32_t{0}, uint32_t{ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE},
                        uint32_t{ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN},
                        uint32_t{ARCPOOL_DEALLOCATE_FLAG_DEFERRED}}) {
    SCOPED_TRACE(flag);
    arcpool_allocation_t* a = allocate(kBytes, origin_);
    EXPECT_OK(work_->fill(data(a), kBytes, kTag, 0, origin_));
    EXPECT_OK(arcpool_transfer(a, user_));  // the reader is the current stream
    gate_ = &block(user_);
    const uint64_t before = work_->verified_words();
    EXPECT_OK(work_->verify(data(a), kBytes, kTag, 0, user_));
    EXPECT_OK(arcpool_deallocate_async(a, other_, flag));
    arcpool_allocation_release(a);
    let_early_frees_land();
    arcpool_allocation_t* b = allocate(kBytes, other_);
    arcpool_allocation_t* c = allocate(kBytes, origin_);
    EXPECT_OK(work_->fill(data(b), kBytes, kTag + 1, 0, other_));
    EXPECT_OK(work_->fill(data(c), kBytes, kTag + 2, 0, origin_));
    let_early_frees_land();
    gate_->open();
    for (arcpool_stream_t s : {origin_, user_, other_})
      sync(s);
    EXPECT_EQ(0u, work_->mismatches());
    EXPECT_EQ(before + kBytes / 4, work_->verified_words());
    finish_reclaims();
    for (auto [h, s] : {std::pair{b, other_}, std::pair{c, origin_}}) {
      EXPECT_OK(arcpool_deallocate_async(h, s, 0));
      arcpool_allocation_release(h);
    }
  }
}

TEST_P(Reuse, ARecordedUseHoldsTheFree) {
  arcpool_allocation_t* a = read_while_held();
  EXPECT_OK(arcpool_record_use(a, user_));
  EXPECT_OK(arcpool_deallocate_async(a, origin_, 0));
  arcpool_allocation_release(a);
  reallocate_release_and_check();
}

TEST_P(Reuse, ATransferHoldsTheReceiverAndTheFree) {
  arcpool_allocation_t* a = read_while_held();
  EXPECT_OK(arcpool_record_use(a, user_));
  EXPECT_OK(arcpool_transfer(a, other_));  // other_ now waits for the held reader
  EXPECT_OK(arcpool_deallocate_async(a, other_, 0));
  arcpool_allocation_release(a);
  reallocate_release_and_check();
}

TEST_P(Reuse, IndeterminateLifetimeHoldsTheFree) {
  arcpool_allocation_t* a = read_while_held(ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
  EXPECT_OK(arcpool_record_use(a, user_));
  EXPECT_OK(arcpool_deallocate_async(a, origin_, 0));
  arcpool_allocation_release(a);
  reallocate_release_and_check();
}

TEST_P(Reuse, AnImplicitFreeHoldsForTheReader) {
  arcpool_allocation_t* a = read_while_held();
  EXPECT_OK(arcpool_record_use(a, user_));
  arcpool_allocation_release(a);  // a leaked owner
  EXPECT_EQ(1u, stats().implicit_frees);
  reallocate_release_and_check();
}

/// The deliberately wrong program: a free without its fence. The reader is held; the free's
/// poison runs on another stream at once, with no wait on the reader, as a free routed without
/// its fence would. Poison mode makes the reader see it. (The memory itself is given back
/// after the reader, so that the host driver's reader never touches freed host memory.)
TEST_P(Reuse, PoisonModeCatchesAFreeWithoutItsFence) {
  arcpool_allocation_t* a = read_while_held();
  void* p = nullptr;
  EXPECT_OK(arcpool_allocation_export(a, &p));  // the raw pointer is ours to mishandle
  arcpool_allocation_release(a);
  sync(origin_);  // the fill is done; only the held reader still needs the memory
  EXPECT_OK(work_->poison(p, kBytes, other_));  // no wait on the reader: the missing fence
  sync(other_);
  gate_->open();
  sync(user_);
  EXPECT_GT(work_->mismatches(), 0u) << "poison mode did not catch the missing fence";
  EXPECT_OK(core().drv().pool_free(p, kBytes, user_));
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(Reuse);

// The poison kernel of a device-1 allocator's free, made by a thread whose current device is 0,
// runs: the before-free hook runs with the allocator's device current, and "a kernel launch will
// fail if it is issued to a stream that is not associated with the current device" (CUDA
// programming guide, "Stream and Event Behavior"; simcuda refuses it too). Before, the launch
// failed and the freed block was never poisoned.
TEST(ReuseOnTwoDevices, AFreeFromAThreadOnAnotherDeviceIsPoisoned) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  int devices = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "needs two CUDA devices (one here)";
  std::thread([] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    const std::unique_ptr<kernels::workload> work = kernels::make_cuda_workload();
    ASSERT_NE(nullptr, work) << "kernels off";
    arcpool_allocator_options_t options;
    arcpool_allocator_options_init(&options);
    options.driver = ARCPOOL_DRIVER_CUDA;
    options.device = 1;
    options.before_free = &kernels::workload::poison_before_free;
    options.before_free_user_data = work.get();
    arcpool_allocator_t* alloc = nullptr;
    ASSERT_OK(arcpool_allocator_create(&options, &alloc));
    arcpool_stream_t s = nullptr;
    ASSERT_OK(arcpool_stream_create(alloc, &s));
    constexpr size_t kWords = 1024;
    arcpool_allocation_t* a = nullptr;
    ASSERT_OK(arcpool_allocate_async(alloc, kWords * 4, 0, s, 0, &a));
    void* p = nullptr;
    ASSERT_OK(arcpool_allocation_data(a, &p));
    ASSERT_OK(arcpool_deallocate_async(a, s, 0));  // into s's cache, poisoned first
    arcpool_allocation_release(a);
    ASSERT_OK(arcpool_stream_synchronize(alloc, s));
    // The block stays in the cache, allocated as far as the pool goes: read it back on its
    // device (only device 1 has access to its pool).
    std::vector<uint32_t> words(kWords, 0);
    ASSERT_EQ(cudaSuccess, cudaSetDevice(1));
    ASSERT_EQ(cudaSuccess, cudaMemcpy(words.data(), p, kWords * 4, cudaMemcpyDefault));
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    EXPECT_EQ(std::vector<uint32_t>(kWords, kernels::kPoisonWord), words)
        << "the freed block was not poisoned";
    ASSERT_OK(arcpool_stream_destroy(alloc, s));
    arcpool_allocator_destroy(alloc);
  }).join();
}

}  // namespace
}  // namespace arcpool::test
