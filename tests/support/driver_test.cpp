#include "support/driver_test.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iostream>
#include <random>
#include <thread>

#include "drivers/deterministic.hpp"
#include "drivers/host_stream.hpp"
#include "support/simcuda_probe.hpp"

namespace arcpool::test {

bool gpu_required() {
  const char* env = std::getenv("ARCPOOL_REQUIRE_GPU");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

void make_standalone_host_allocator(standalone_host_allocator* out) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_HOST;
  ASSERT_OK(arcpool_allocator_create(&options, &out->alloc));
  ASSERT_OK(arcpool_stream_create(out->alloc, &out->s));
  ASSERT_OK(arcpool_stream_create(out->alloc, &out->other));
}

std::string cuda_unavailable_reason() {
  static const std::string reason = [] {
    std::string why;
    return detail::cuda_device_usable(0, &why) ? std::string() : why;
  }();
  return reason;
}

namespace {

/// ARCPOOL_TEST_SEED when set, else a fresh random seed (never 0: 0 means not deterministic).
uint64_t deterministic_seed() {
  if (const char* env = std::getenv("ARCPOOL_TEST_SEED"); env != nullptr && *env != '\0') {
    const uint64_t seed = std::strtoull(env, nullptr, 0);
    if (seed != 0) return seed;
  }
  std::random_device rd;
  const uint64_t seed = (uint64_t{rd()} << 32) ^ rd();
  return seed == 0 ? 1 : seed;
}

}  // namespace

void DriverTest::SetUp() {
  if (GetParam().kind == ARCPOOL_DRIVER_CUDA) ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = GetParam().kind;
  if (deterministic()) {
    seed_ = deterministic_seed();
    options.host_deterministic_seed = seed_;
  }
  // The model's tests count every free: the fast path's cache is off unless a suite turns it
  // on (cache_test.cpp, reuse_test.cpp).
  options.stream_cache_bytes = 0;
  static std::mutex logs_mutex;
  static std::deque<free_log> logs;
  {
    std::lock_guard<std::mutex> lock(logs_mutex);
    free_log_ = &logs.emplace_back();
  }
  options.before_free = [](void* p, size_t bytes, arcpool_stream_t s, void* user_data) {
    auto* log = static_cast<free_log*>(user_data);
    std::lock_guard<std::mutex> lock(log->mutex);
    log->frees.push_back({p, bytes, s});
  };
  options.before_free_user_data = free_log_;
  customize(options);
  ASSERT_OK(arcpool_allocator_create(&options, &alloc_));
  if (deterministic()) {
    ASSERT_TRUE(detail::deterministic::is_deterministic(core().drv()));
    probe_ = make_deterministic_probe(alloc_);
  } else {
    probe_ = on_host() ? make_host_probe(alloc_) : make_cuda_probe();
  }
}

void DriverTest::TearDown() {
  if (alloc_ == nullptr) return;
  // A test that failed in a capture left it open: ended here, or every later test of the binary
  // fails by the capture's rules (a thread-local or global capture refuses this thread's
  // potentially unsafe calls: cudaStreamBeginCapture).
  for (const auto* list : {&streams_, &app_streams_}) {
    for (arcpool_stream_t s : *list) {
      bool capturing = false;
      if (core().drv().stream_is_capturing(s, &capturing) != ARCPOOL_STATUS_SUCCESS || !capturing) {
        continue;
      }
      ADD_FAILURE() << "stream " << s << " was left capturing: the capture is ended";
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(reinterpret_cast<cudaStream_t>(s), &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  }
  for (auto& g : gates_)
    g->open();
  for (const exported_block& b : exported_)
    free_exported(b.pointer, b.bytes, b.stream);
  for (arcpool_stream_t s : streams_)
    sync(s);
  for (arcpool_stream_t s : app_streams_)
    sync(s);
  if (deterministic()) {
    // Complete the deferred frees and flush the caches while the checker can still be read
    // (it goes with the allocator), then report every unordered access and free.
    arcpool_allocator_trim(alloc_, 0);
    // Every stream's queue too (the legacy and per-thread default streams' frees, the trim's
    // flushes), not only the fixture's: their frees are checked before the list is read.
    detail::deterministic::run(core().drv());
    std::string all;
    for (const std::string& v : detail::deterministic::violations(core().drv()))
      all += "  " + v + "\n";
    if (!all.empty()) ADD_FAILURE() << "happens-before violations:\n" << all;
    if (HasFailure()) {
      std::cerr << "[ SEED     ] deterministic driver seed " << seed_
                << ": ARCPOOL_TEST_SEED=" << seed_ << " replays this schedule\n";
    }
  }
  gates_.clear();
  markers_.clear();
  for (arcpool_stream_t s : app_streams_)
    core().drv().stream_destroy(s);
  for (arcpool_stream_t s : streams_)
    arcpool_stream_destroy(alloc_, s);
  probe_.reset();
  arcpool_allocator_destroy(alloc_);
  alloc_ = nullptr;
  // On simcuda, undefined behaviour CUDA would not report fails the test that caused it.
  if (const std::string v = take_simcuda_violations(); !v.empty()) {
    ADD_FAILURE() << "simcuda violations:\n" << v;
  }
}

detail::allocator& DriverTest::core() const {
  return *detail::from_handle(alloc_);
}

arcpool_stream_t DriverTest::make_stream() {
  arcpool_stream_t s = nullptr;
  EXPECT_OK(arcpool_stream_create(alloc_, &s));
  streams_.push_back(s);
  return s;
}

arcpool_stream_t DriverTest::make_app_stream() {
  arcpool_stream_t s = nullptr;
  EXPECT_OK(core().drv().stream_create(&s));
  app_streams_.push_back(s);
  return s;
}

void DriverTest::destroy_app_stream(arcpool_stream_t s) {
  sync(s);
  for (auto it = app_streams_.begin(); it != app_streams_.end(); ++it) {
    if (*it == s) {
      app_streams_.erase(it);
      break;
    }
  }
  EXPECT_OK(core().drv().stream_destroy(s));
}

void DriverTest::sync(arcpool_stream_t s) {
  EXPECT_OK(core().drv().stream_synchronize(s));
}

gate& DriverTest::block(arcpool_stream_t s) {
  gates_.push_back(probe_->block(s));
  return *gates_.back();
}

std::shared_ptr<marker> DriverTest::mark(arcpool_stream_t s) {
  markers_.push_back(probe_->mark(s));
  return markers_.back();
}

void DriverTest::settle(arcpool_stream_t s) {
  if (deterministic()) {
    // Every stream runs as far as it can: a marker not reached now cannot be reached without
    // the test.
    detail::deterministic::run(core().drv());
  } else if (on_host()) {
    detail::host_stream_find(s)->settle();
  } else if (!simcuda_settle(s)) {
    // A GPU gives no way to see that a stream is blocked: 20 ms is what it gets.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void DriverTest::fill_async(arcpool_stream_t s, void* p, size_t bytes, int value) {
  if (!on_host()) {
    EXPECT_EQ(cudaSuccess, cudaMemsetAsync(p, value, bytes, reinterpret_cast<cudaStream_t>(s)));
    return;
  }
  if (deterministic()) {
    // The checker sees the write: a free (or a reuse) not ordered after it is a violation.
    EXPECT_OK(detail::deterministic::access(core().drv(), p, bytes, s,
                                            "fill_async(" + std::to_string(value) + ")"));
  }
  struct fill {
    void* p;
    size_t bytes;
    int value;
  };
  EXPECT_OK(arcpool_stream_launch_host_func(
      alloc_, s,
      [](void* arg) {
        auto* f = static_cast<fill*>(arg);
        std::memset(f->p, f->value, f->bytes);
        delete f;
      },
      new fill{p, bytes, value}));
}

void DriverTest::expect_filled(const void* p, size_t bytes, int value) {
  std::vector<unsigned char> host(bytes);
  if (on_host()) {
    std::memcpy(host.data(), p, bytes);
  } else {
    ASSERT_EQ(cudaSuccess, cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
  }
  size_t bad = 0;
  for (unsigned char c : host)
    bad += c != static_cast<unsigned char>(value);
  EXPECT_EQ(0u, bad) << bytes << " bytes at " << p << " should all be " << value;
}

void DriverTest::finish_reclaims() {
  // Generous: thousands of deferred frees under TSan on a loaded 2-core machine take seconds.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (core().reclaim_pending() > 0) {
    if (deterministic()) detail::deterministic::run(core().drv());
    if (core().reclaim_poll_once() == 0) std::this_thread::yield();
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "deferred frees never completed";
  }
  // The frees went to origin streams or the reclaim stream: let them execute.
  for (arcpool_stream_t s : streams_)
    sync(s);
  for (arcpool_stream_t s : app_streams_)
    sync(s);
}

void DriverTest::run_unheld(std::initializer_list<arcpool_stream_t> unheld) {
  // A stream that waits for a held one (a false dependency) fails here: a bare synchronization
  // of it would hang the test until the harness's timeout.
  const auto drain = [&] {
    for (arcpool_stream_t s : unheld) {
      const std::shared_ptr<marker> end = mark(s);
      settle(s);
      if (!end->reached()) {
        ADD_FAILURE() << "stream " << s << " waits for a held stream";
        return false;
      }
      sync(s);
    }
    return true;
  };
  if (!drain()) return;
  core().reclaim_poll_once();
  drain();
}

void DriverTest::expect_pending(size_t items, uint64_t pending_bytes, uint64_t frees) {
  EXPECT_EQ(items, core().reclaim_pending()) << "deferred frees still waiting for a held stream";
  const arcpool_stats_t st = stats();
  EXPECT_EQ(pending_bytes, st.bytes_pending_free_current) << "bytes still pending free";
  EXPECT_EQ(frees, st.frees) << "blocks returned to the pool";
}

uint64_t DriverTest::work_enqueued(arcpool_stream_t s) const {
  if (deterministic()) return detail::deterministic::enqueued(core().drv(), s);
  if (on_host()) {
    const auto hs = detail::host_stream_find(s);
    return hs ? hs->enqueued() : 0;
  }
  return 0;
}

std::vector<DriverTest::enqueued_free> DriverTest::frees_enqueued() const {
  std::lock_guard<std::mutex> lock(free_log_->mutex);
  return free_log_->frees;
}

std::vector<arcpool_stream_t> DriverTest::streams_that_freed(const void* block,
                                                             size_t since) const {
  const std::vector<enqueued_free> all = frees_enqueued();
  std::vector<arcpool_stream_t> streams;
  for (size_t i = since; i < all.size(); ++i) {
    if (all[i].block == block) streams.push_back(all[i].stream);
  }
  return streams;
}

arcpool_placement_t DriverTest::placement(const arcpool_allocation_t* a) const {
  arcpool_placement_t p{};
  p.struct_size = sizeof(p);
  p.version = ARCPOOL_PLACEMENT_VERSION;
  EXPECT_OK(arcpool_allocation_placement(a, &p));
  return p;
}

void* DriverTest::data(arcpool_allocation_t* a) {
  void* p = nullptr;
  EXPECT_OK(arcpool_allocation_data(a, &p));
  return p;
}

arcpool_allocation_t* DriverTest::allocate(size_t bytes, arcpool_stream_t s, uint32_t flags) {
  arcpool_allocation_t* a = nullptr;
  EXPECT_OK(arcpool_allocate_async(alloc_, bytes, 0, s, flags, &a));
  return a;
}

arcpool_stats_t DriverTest::stats() const {
  arcpool_stats_t s{};
  s.struct_size = sizeof(s);
  s.version = ARCPOOL_STATS_VERSION;
  EXPECT_OK(arcpool_stats_get(alloc_, &s));
  return s;
}

std::vector<arcpool_stream_stats_t> DriverTest::stream_stats_rows() const {
  std::vector<arcpool_stream_stats_t> out(ARCPOOL_STREAM_STATS_ROWS + 1);
  size_t count = 0;
  EXPECT_OK(arcpool_stream_stats_list(alloc_, out.data(), sizeof(out[0]), out.size(), &count));
  out.resize(count);
  return out;
}

arcpool_stream_stats_t DriverTest::stream_stats_row(arcpool_stream_t s, bool other) const {
  for (const arcpool_stream_stats_t& r : stream_stats_rows()) {
    if (other ? r.other == 1 : (r.other == 0 && r.stream == s)) return r;
  }
  ADD_FAILURE() << "no statistics row for stream " << static_cast<void*>(s);
  return {};
}

arcpool_allocation_info_t DriverTest::info(const arcpool_allocation_t* a) const {
  arcpool_allocation_info_t i{};
  i.struct_size = sizeof(i);
  i.version = ARCPOOL_ALLOCATION_INFO_VERSION;
  EXPECT_OK(arcpool_allocation_info(a, &i));
  return i;
}

arcpool_allocation_t* DriverTest::make_in_state(arcpool_allocation_state_t state,
                                                arcpool_stream_t s, uint32_t owners) {
  arcpool_allocation_t* a = allocate(4096, s);
  for (uint32_t i = 1; i < owners; ++i)
    EXPECT_OK(arcpool_allocation_preserve(a));
  switch (state) {
    case ARCPOOL_ALLOCATION_LIVE:
      break;
    case ARCPOOL_ALLOCATION_UNOWNED: {
      int last = 0;
      EXPECT_OK(arcpool_allocation_discard(a, &last));
      EXPECT_EQ(1, last);
      break;
    }
    case ARCPOOL_ALLOCATION_DEALLOCATED:
      EXPECT_OK(arcpool_deallocate_async(a, s, 0));
      break;
    case ARCPOOL_ALLOCATION_EXPORTED: {
      void* p = nullptr;
      EXPECT_OK(arcpool_allocation_export(a, &p));
      exported_.push_back({p, 4096, s});
      break;
    }
  }
  EXPECT_EQ(state, info(a).state);
  return a;
}

void DriverTest::free_exported(void* pointer, size_t bytes, arcpool_stream_t s) {
  EXPECT_OK(core().drv().pool_free(pointer, bytes, s));
}

}  // namespace arcpool::test
