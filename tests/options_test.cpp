// Allocator options and the driver choice (AUTO, ARCPOOL_DRIVER), and the versioned structs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

/// Sets an environment variable for the scope.
class scoped_env {
 public:
  scoped_env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~scoped_env() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

arcpool_allocator_options_t defaults() {
  arcpool_allocator_options_t o;
  arcpool_allocator_options_init(&o);
  return o;
}

/// A host-driver allocator made from `o` (its driver set to the host's) and a stream of it.
void host_allocator_and_stream(arcpool_allocator_options_t o, arcpool_allocator_t** a,
                               arcpool_stream_t* s) {
  o.driver = ARCPOOL_DRIVER_HOST;
  ASSERT_OK(arcpool_allocator_create(&o, a));
  ASSERT_OK(arcpool_stream_create(*a, s));
}

TEST(Options, DefaultsAreTheDocumentedOnes) {
  const auto o = defaults();
  EXPECT_EQ(sizeof(o), o.struct_size);
  EXPECT_EQ(ARCPOOL_ALLOCATOR_OPTIONS_VERSION, o.version);
  EXPECT_EQ(0, o.device);
  EXPECT_EQ(ARCPOOL_DRIVER_AUTO, o.driver);
  EXPECT_EQ(ARCPOOL_POOL_OWNED, o.pool_source);
  EXPECT_EQ(UINT64_MAX, o.release_threshold);
  EXPECT_EQ(1, o.reuse_follow_event_dependencies);
  EXPECT_EQ(1, o.reuse_allow_opportunistic);
  EXPECT_EQ(0, o.reuse_allow_internal_dependencies);
  EXPECT_EQ(0u, o.hard_limit_bytes);
}

TEST(Options, AnUninitializedStructIsRejected) {
  arcpool_allocator_options_t o{};
  arcpool_allocator_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a));
  EXPECT_NE(std::string(arcpool_last_error()).find("arcpool_allocator_options_init"),
            std::string::npos);
  EXPECT_EQ(nullptr, a);
}

TEST(Options, BadFieldsAreRejected) {
  arcpool_allocator_t* a = nullptr;
  auto o = defaults();
  o.device = -1;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a));
  // Out-of-range enum values, written as a C caller would (raw integers).
  const int seven = 7;
  o = defaults();
  std::memcpy(&o.driver, &seven, sizeof(seven));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a));
  o = defaults();
  std::memcpy(&o.foreign_stream_routing, &seven, sizeof(seven));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a));
  o = defaults();
  std::memcpy(&o.pool_source, &seven, sizeof(seven));
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a));
  o = defaults();
  o.peer_device_count = 2;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a));
  EXPECT_EQ(nullptr, a);
}

// The peer list is checked on every driver: on the host drivers a list the CUDA driver refuses
// was accepted (design.md §10: bad options are INVALID_ARGUMENT naming the field).
TEST(Options, APeerListNamingNoOtherDeviceIsRejectedOnEveryDriver) {
  for (const arcpool_driver_kind_t driver : {ARCPOOL_DRIVER_HOST, ARCPOOL_DRIVER_NULL}) {
    for (const int peer : {-1, 0}) {
      arcpool_allocator_t* a = nullptr;
      auto o = defaults();
      o.driver = driver;
      o.peer_devices = &peer;
      o.peer_device_count = 1;
      EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a))
          << arcpool_driver_name(driver) << ", peer " << peer;
      EXPECT_EQ(nullptr, a);
      EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "peer_devices[0]"))
          << arcpool_last_error();
      arcpool_allocator_destroy(a);
    }
  }
}

// ARCPOOL_PEER_ACCESS takes 0 or 1: another value ("yes", "true") left the peers without access,
// with no word, until a peer's kernel faulted on the memory.
TEST(Options, APeerAccessEnvironmentOtherThanZeroOrOneIsRejected) {
  ASSERT_OK(arcpool_default_allocator_set(0, nullptr));  // device 0's next default is made anew
  {
    scoped_env env("ARCPOOL_PEER_ACCESS", "yes");
    EXPECT_EQ(nullptr, arcpool_malloc_async(256, 0, nullptr));
    EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "ARCPOOL_PEER_ACCESS=yes"))
        << arcpool_last_error();
  }
  scoped_env env("ARCPOOL_PEER_ACCESS", "0");
  void* p = arcpool_malloc_async(256, 0, nullptr);
  EXPECT_NE(nullptr, p) << arcpool_last_error();
  EXPECT_OK(arcpool_free_async(p, 256, 0, nullptr));
  EXPECT_OK(arcpool_default_allocator_set(0, nullptr));
}

TEST(Options, AnEventPoolCapacityAboveItsBoundIsRejected) {
  // SIZE_MAX ("no bound") would make a thread's first fence reserve more than a vector can
  // hold: std::length_error in a noexcept function, which ends the process.
  arcpool_allocator_t* a = nullptr;
  auto o = defaults();
  o.driver = ARCPOOL_DRIVER_HOST;
  o.event_pool_capacity = SIZE_MAX;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(&o, &a));
  EXPECT_EQ(nullptr, a);
  EXPECT_NE(nullptr, std::strstr(arcpool_last_error(), "event_pool_capacity"));
  o.event_pool_capacity = ARCPOOL_MAX_EVENT_POOL_CAPACITY;
  ASSERT_STATUS(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_create(&o, &a));
  arcpool_allocator_destroy(a);
}

TEST(Options, TheEnvironmentOverridesAuto) {
  scoped_env env("ARCPOOL_DRIVER", "host");
  arcpool_allocator_t* a = nullptr;
  ASSERT_OK(arcpool_allocator_create(nullptr, &a));
  EXPECT_EQ(ARCPOOL_DRIVER_HOST, arcpool_allocator_driver(a));
  EXPECT_STREQ("host", arcpool_driver_name(arcpool_allocator_driver(a)));
  arcpool_allocator_destroy(a);
}

TEST(Options, AnUnknownEnvironmentDriverIsRejected) {
  scoped_env env("ARCPOOL_DRIVER", "tpu");
  arcpool_allocator_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(nullptr, &a));
  EXPECT_NE(std::string(arcpool_last_error()).find("tpu"), std::string::npos);
}

// arcpool_auto_driver reads ARCPOOL_DRIVER as creation does: a value naming no driver resolves
// to nothing, with creation's message, not to the driver creation would refuse to make.
TEST(Options, AutoDriverNamesNoDriverForAnUnknownEnvironmentDriver) {
  scoped_env env("ARCPOOL_DRIVER", "tpu");
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocator_create(nullptr, nullptr))
      << "another message first";
  EXPECT_EQ(ARCPOOL_DRIVER_AUTO, arcpool_auto_driver(0));
  EXPECT_NE(std::string(arcpool_last_error()).find("ARCPOOL_DRIVER=tpu"), std::string::npos)
      << arcpool_last_error();
}

TEST(Options, AutoPicksCudaWhenUsableElseHost) {
  scoped_env env("ARCPOOL_DRIVER", "");
  arcpool_allocator_t* a = nullptr;
  ASSERT_OK(arcpool_allocator_create(nullptr, &a));
  EXPECT_EQ(cuda_unavailable_reason().empty() ? ARCPOOL_DRIVER_CUDA : ARCPOOL_DRIVER_HOST,
            arcpool_allocator_driver(a));
  arcpool_allocator_destroy(a);
}

TEST(Options, RequestingCudaWithoutAGpuIsNoDeviceWithTheReason) {
  if (cuda_unavailable_reason().empty()) GTEST_SKIP() << "a GPU is usable here";
  auto o = defaults();
  o.driver = ARCPOOL_DRIVER_CUDA;
  arcpool_allocator_t* a = nullptr;
  EXPECT_STATUS(ARCPOOL_STATUS_NO_DEVICE, arcpool_allocator_create(&o, &a));
  EXPECT_NE(std::string(arcpool_last_error()).find("cuda"), std::string::npos)
      << arcpool_last_error();
  scoped_env env("ARCPOOL_DRIVER", "cuda");
  EXPECT_STATUS(ARCPOOL_STATUS_NO_DEVICE, arcpool_allocator_create(nullptr, &a));
  EXPECT_NE(std::string(arcpool_last_error()).find("ARCPOOL_DRIVER"), std::string::npos)
      << arcpool_last_error();
}

TEST(VersionedStructs, AnOlderSmallerStatsStructGetsItsPrefix) {
  arcpool_allocator_t* a = nullptr;
  arcpool_stream_t s = nullptr;
  ASSERT_NO_FATAL_FAILURE(host_allocator_and_stream(defaults(), &a, &s));
  arcpool_allocation_t* h = nullptr;
  ASSERT_OK(arcpool_allocate_async(a, 4096, 0, s, 0, &h));
  // A caller built against a header whose struct ended after bytes_in_use_peak.
  unsigned char raw[sizeof(arcpool_stats_t) + 16];
  std::memset(raw, 0xAB, sizeof(raw));
  auto* stats = reinterpret_cast<arcpool_stats_t*>(raw);
  const size_t old_size = offsetof(arcpool_stats_t, bytes_in_use_peak) + sizeof(uint64_t);
  stats->struct_size = old_size;
  stats->version = 1;
  ASSERT_OK(arcpool_stats_get(a, stats));
  EXPECT_EQ(4096u, stats->bytes_in_use_current);
  EXPECT_EQ(old_size, stats->struct_size) << "the caller's header fields are kept";
  EXPECT_EQ(0xAB, raw[old_size]) << "nothing written past the caller's struct";
  stats->struct_size = 4;
  EXPECT_STATUS(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_stats_get(a, stats));
  ASSERT_OK(arcpool_stats_reset_peaks(a));
  size_t length = 0;
  ASSERT_OK(arcpool_stats_json(a, nullptr, 0, &length));
  std::string json(length + 1, '\0');
  ASSERT_OK(arcpool_stats_json(a, json.data(), json.size(), nullptr));
  EXPECT_EQ('}', json[length - 1]);
  char tiny[8];
  ASSERT_OK(arcpool_stats_json(a, tiny, sizeof(tiny), &length));
  EXPECT_EQ('\0', tiny[7]) << "truncated and terminated";
  ASSERT_OK(arcpool_deallocate_async(h, s, 0));
  arcpool_allocation_release(h);
  ASSERT_OK(arcpool_stream_destroy(a, s));
  arcpool_allocator_destroy(a);
}

TEST(Stats, ResetPeaksRestartsEveryHighWaterMarkThePoolsIncluded) {
  auto o = defaults();
  o.stream_cache_bytes = 0;
  arcpool_allocator_t* a = nullptr;
  arcpool_stream_t s = nullptr;
  ASSERT_NO_FATAL_FAILURE(host_allocator_and_stream(o, &a, &s));
  constexpr size_t kBytes = 4 << 20;  // above every gauge's batch
  arcpool_allocation_t* h = nullptr;
  ASSERT_OK(arcpool_allocate_async(a, kBytes, 0, s, 0, &h));
  ASSERT_OK(arcpool_deallocate_async(h, s, 0));
  arcpool_allocation_release(h);
  ASSERT_OK(arcpool_stream_synchronize(a, s));  // the free ran: nothing reserved now
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  ASSERT_OK(arcpool_stats_get(a, &st));
  EXPECT_EQ(kBytes, st.bytes_in_use_peak);
  EXPECT_EQ(kBytes, st.pool_reserved_bytes_peak);
  ASSERT_OK(arcpool_stats_reset_peaks(a));
  ASSERT_OK(arcpool_stats_get(a, &st));
  EXPECT_EQ(0u, st.bytes_in_use_peak);
  EXPECT_EQ(0u, st.pool_reserved_bytes_peak) << "the pool's high-water mark was not reset";
  ASSERT_OK(arcpool_stream_destroy(a, s));
  arcpool_allocator_destroy(a);
}

// Issue 9, bug 10: the demo printed an allocations_in_use peak of 0 next to a 20 MiB
// bytes_in_use peak (the count's batch of 64 never flushed). The count is flushed with the
// bytes, so the count peak accounts for the byte peak.
TEST(Stats, TheAllocationCountPeakIsTakenWithTheBytePeak) {
  arcpool_allocator_t* a = nullptr;
  arcpool_stream_t s = nullptr;
  ASSERT_NO_FATAL_FAILURE(host_allocator_and_stream(defaults(), &a, &s));
  constexpr size_t kBytes = 1 << 20;  // one byte batch: every second allocation flushes
  constexpr int kLive = 20;           // far below the count's batch of 64
  std::vector<arcpool_allocation_t*> live(kLive);
  for (arcpool_allocation_t*& h : live)
    ASSERT_OK(arcpool_allocate_async(a, kBytes, 0, s, 0, &h));
  for (arcpool_allocation_t* h : live) {
    ASSERT_OK(arcpool_deallocate_async(h, s, 0));
    arcpool_allocation_release(h);
  }
  ASSERT_OK(arcpool_stream_synchronize(a, s));
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  ASSERT_OK(arcpool_stats_get(a, &st));
  EXPECT_EQ(uint64_t{kLive} * kBytes, st.bytes_in_use_peak);
  EXPECT_EQ(uint64_t{kLive}, st.allocations_in_use_peak)
      << "a byte peak of " << st.bytes_in_use_peak << " bytes in allocations of " << kBytes
      << " bytes needs that many live allocations";
  ASSERT_OK(arcpool_stream_destroy(a, s));
  arcpool_allocator_destroy(a);
}

/// Reads `a`'s statistics for 2 s while `workers` run (then stops and joins them): in each
/// read, every gauge's peak is at least its current value, and no gauge reads below zero (a
/// uint64_t wrapped from -1). The first gauge read wrong, or "".
std::string read_gauges_while(arcpool_allocator_t* a, std::atomic<bool>& stop,
                              std::vector<std::thread>& workers) {
  std::string wrong;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (wrong.empty() && std::chrono::steady_clock::now() < until) {
    arcpool_stats_t st{};
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    if (arcpool_stats_get(a, &st) != ARCPOOL_STATUS_SUCCESS) break;
#define ARCPOOL_TEST_GAUGE_(name, doc)                                                          \
  if (st.name##_peak < st.name##_current || st.name##_current > (uint64_t{1} << 62)) {          \
    wrong = std::string(#name) + ": current " + std::to_string(st.name##_current) + ", peak " + \
            std::to_string(st.name##_peak);                                                     \
  }
    ARCPOOL_STATS_GAUGES(ARCPOOL_TEST_GAUGE_)
#undef ARCPOOL_TEST_GAUGE_
  }
  stop = true;
  for (std::thread& w : workers)
    w.join();
  return wrong;
}

TEST(Stats, APeakIsNeverBelowTheCurrentValueReadWithIt) {
  // Another thread allocates and frees 4 KiB on its stream: cache hits, whose moves stay
  // pending in its shard while this one reads.
  arcpool_allocator_t* a = nullptr;
  arcpool_stream_t s = nullptr;
  ASSERT_NO_FATAL_FAILURE(host_allocator_and_stream(defaults(), &a, &s));
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  workers.emplace_back([&] {
    while (!stop.load()) {
      arcpool_allocation_t* h = nullptr;
      if (arcpool_allocate_async(a, 4096, 0, s, 0, &h) != ARCPOOL_STATUS_SUCCESS) break;
      arcpool_deallocate_async(h, s, 0);
      arcpool_allocation_release(h);
    }
  });
  const std::string wrong = read_gauges_while(a, stop, workers);
  EXPECT_TRUE(wrong.empty()) << wrong;
  ASSERT_OK(arcpool_stream_synchronize(a, s));
  ASSERT_OK(arcpool_stream_destroy(a, s));
  arcpool_allocator_destroy(a);
}

TEST(Stats, AGaugeNeverReadsBelowZeroWhileAnotherThreadFreesWhatOneAllocated) {
  // One thread allocates 4 KiB on a stream and hands each allocation to another, which frees
  // it there: the allocation's count and bytes are added in the first thread's shard and taken
  // off in the second's, which a read sums after the first.
  arcpool_allocator_t* a = nullptr;
  arcpool_stream_t s = nullptr;
  ASSERT_NO_FATAL_FAILURE(host_allocator_and_stream(defaults(), &a, &s));
  std::atomic<bool> stop{false};
  std::atomic<arcpool_allocation_t*> handed{nullptr};
  std::atomic<bool> first_has_a_shard{false};
  std::vector<std::thread> workers;
  workers.emplace_back([&] {  // first: its shard comes before the other's
    while (!stop.load()) {
      if (handed.load() != nullptr) continue;
      arcpool_allocation_t* h = nullptr;
      const arcpool_status_t status = arcpool_allocate_async(a, 4096, 0, s, 0, &h);
      first_has_a_shard = true;
      if (status != ARCPOOL_STATUS_SUCCESS) break;
      handed = h;
    }
  });
  while (!first_has_a_shard.load()) {
  }
  workers.emplace_back([&] {
    for (;;) {
      arcpool_allocation_t* h = handed.exchange(nullptr);
      if (h == nullptr) {
        if (stop.load()) break;
        continue;
      }
      arcpool_deallocate_async(h, s, 0);
      arcpool_allocation_release(h);
    }
  });
  const std::string wrong = read_gauges_while(a, stop, workers);
  EXPECT_TRUE(wrong.empty()) << wrong;
  if (arcpool_allocation_t* h = handed.exchange(nullptr)) {
    EXPECT_OK(arcpool_deallocate_async(h, s, 0));
    arcpool_allocation_release(h);
  }
  ASSERT_OK(arcpool_stream_synchronize(a, s));
  ASSERT_OK(arcpool_stream_destroy(a, s));
  arcpool_allocator_destroy(a);
}

TEST(Stats, ResetPeaksRestartsTheCudaPoolsHighWaterMarkAtItsReservation) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  auto o = defaults();
  o.driver = ARCPOOL_DRIVER_CUDA;
  o.stream_cache_bytes = 0;  // owned pool, release threshold UINT64_MAX: the memory stays
  arcpool_allocator_t* a = nullptr;
  ASSERT_OK(arcpool_allocator_create(&o, &a));
  arcpool_stream_t s = nullptr;
  ASSERT_OK(arcpool_stream_create(a, &s));
  arcpool_allocation_t* big = nullptr;
  ASSERT_OK(arcpool_allocate_async(a, 32 << 20, 0, s, 0, &big));
  ASSERT_OK(arcpool_deallocate_async(big, s, 0));
  arcpool_allocation_release(big);
  ASSERT_OK(arcpool_allocator_trim(a, 0));  // reserved back to 0; the peak stays at 32 MiB
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  ASSERT_OK(arcpool_stats_get(a, &st));
  EXPECT_GE(st.pool_reserved_bytes_peak, uint64_t{32} << 20);
  ASSERT_OK(arcpool_stats_reset_peaks(a));
  ASSERT_OK(arcpool_stats_get(a, &st));
  EXPECT_EQ(st.pool_reserved_bytes_current, st.pool_reserved_bytes_peak)
      << "the pool's high-water mark restarts at its reservation";
  ASSERT_OK(arcpool_stream_destroy(a, s));
  arcpool_allocator_destroy(a);
}

TEST(VersionedStructs, StatusStringsNameEveryStatus) {
  for (int s = ARCPOOL_STATUS_SUCCESS; s <= ARCPOOL_STATUS_PEER_GONE; ++s) {
    EXPECT_STRNE("ARCPOOL_STATUS_(unknown)",
                 arcpool_status_string(static_cast<arcpool_status_t>(s)));
  }
  EXPECT_EQ(ARCPOOL_VERSION, arcpool_version());
}

}  // namespace
}  // namespace arcpool::test
