// The C++ API: buffer / shared_buffer claims, views, transfer, exceptions. On both drivers.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <atomic>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "arcpool/arcpool.hpp"
#include "drivers/host_stream.hpp"
#include "support/driver_test.hpp"
#include "support/pickle_reader.hpp"

namespace arcpool::test {
namespace {

static_assert(!std::is_copy_constructible_v<buffer>, "a buffer is the sole claim");
static_assert(std::is_nothrow_move_constructible_v<buffer>);
static_assert(std::is_copy_constructible_v<shared_buffer>, "a copy is a preserve");
static_assert(std::is_nothrow_destructible_v<buffer>);
static_assert(std::is_nothrow_destructible_v<shared_buffer>);
static_assert(std::is_base_of_v<std::bad_alloc, out_of_memory>);

class CppApi : public DriverTest {
 protected:
  void SetUp() override {
    DriverTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    allocator_options options;
    options.driver = GetParam();
    options.stream_cache_bytes = 0;  // these tests count frees
    cpp_ = std::make_unique<allocator>(options);
  }
  void TearDown() override {
    cpp_.reset();
    DriverTest::TearDown();
  }

  arcpool_stats_t cpp_stats() const { return cpp_->stats(); }

  std::unique_ptr<allocator> cpp_;
};

TEST_P(CppApi, MovingABufferIntoItselfKeepsItsClaim) {
  stream s = cpp_->create_stream();
  buffer b = cpp_->allocate_async(4096, s);
  buffer& same = b;
  b = std::move(same);
  EXPECT_TRUE(b);
  EXPECT_EQ(0u, cpp_stats().deallocations);
  EXPECT_EQ(4096u, cpp_stats().bytes_in_use_current);
}

// A buffer or shared_buffer passed as buffer_base& (ipc_exporter::send takes one) cannot be
// assigned or copied through that reference: the copy would share the handle without its claim
// and reference, the left side's own allocation would leak, and the shared handle would be
// released twice. (Before, buffer_base had the implicit shallow copy operations.)
TEST(CppApiTypes, ABufferCannotBeCopiedThroughItsBase) {
  EXPECT_FALSE(std::is_copy_assignable_v<buffer_base>);
  EXPECT_FALSE(std::is_move_assignable_v<buffer_base>);
  EXPECT_FALSE(std::is_copy_assignable_v<buffer>);
  EXPECT_TRUE(std::is_move_assignable_v<buffer>);
  EXPECT_TRUE(std::is_copy_assignable_v<shared_buffer>);
}

TEST_P(CppApi, AStreamKeepsItsAllocatorAliveWhateverTheDestructionOrder) {
  // The allocator object goes first, then the stream that needs it. Had the stream borrowed the
  // allocator, its teardown would run with the allocator object and destroy the streams it
  // created: the stream handle would be dead while the C++ stream still holds it.
  allocator_options options;
  options.driver = GetParam();
  auto a = std::make_unique<allocator>(options);
  stream s = a->create_stream();
  const arcpool_stream_t handle = s.get();
  arcpool_allocator_t* const held = a->get();  // valid only as long as the stream keeps it
  a.reset();
  // Still alive: the stream's own reference kept the allocator, and so its stream.
  const bool alive = on_host()
                         ? detail::host_stream_find(handle) != nullptr
                         : cudaStreamQuery(reinterpret_cast<cudaStream_t>(handle)) == cudaSuccess;
  if (!alive) {
    // The allocator is gone: never touch it again (leak the stream rather than destroy it).
    new stream(std::move(s));
    FAIL() << "the allocator was torn down while its stream still held it";
  }
  s.synchronize();
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  EXPECT_OK(arcpool_stats_get(held, &st)) << "the stream's allocator answers";
  arcpool_allocation_t* b = nullptr;
  EXPECT_OK(arcpool_allocate_async(held, 4096, 0, handle, 0, &b)) << "and still allocates";
  EXPECT_OK(arcpool_deallocate_async(b, handle, 0));
  arcpool_allocation_release(b);
  s = stream();  // the last reference: now the allocator and its stream go
  if (on_host()) {
    EXPECT_EQ(nullptr, detail::host_stream_find(handle)) << "destroyed with the last reference";
  }
}

TEST_P(CppApi, ABufferDeallocatesOnItsCurrentStreamWhenDestroyed) {
  stream producer = cpp_->create_stream();
  stream consumer = cpp_->create_stream();
  {
    buffer b = cpp_->allocate_async(4096, producer);
    EXPECT_NE(nullptr, b.data());
    EXPECT_EQ(4096u, b.size());
    EXPECT_TRUE(b.is_terminal());
    EXPECT_EQ(producer.get(), b.placement().origin_stream);
    b.transfer_to(consumer);
    buffer moved = std::move(b);
    EXPECT_FALSE(b);
    EXPECT_TRUE(moved);
  }
  consumer.synchronize();
  cpp_->trim();
  const auto s = cpp_stats();
  EXPECT_EQ(1u, s.deallocations);
  EXPECT_EQ(1u, s.frees);
  EXPECT_EQ(0u, s.bytes_in_use_current);
}

TEST_P(CppApi, CopyingASharedBufferIsAPreserveAndTheLastCopyFrees) {
  stream s = cpp_->create_stream();
  shared_buffer first = cpp_->allocate_async(4096, s).share();
  EXPECT_TRUE(first.is_terminal());
  {
    shared_buffer second = first;  // preserve
    EXPECT_FALSE(first.is_terminal());
    EXPECT_EQ(first.data(), second.data());
    EXPECT_THROW(second.deallocate_async(s), error) << "not the only owner";
    EXPECT_TRUE(second) << "a failed deallocation keeps the handle";
  }
  EXPECT_TRUE(first.is_terminal());
  EXPECT_EQ(0u, cpp_stats().deallocations);
  first.reset();
  s.synchronize();
  EXPECT_EQ(1u, cpp_stats().deallocations);
  EXPECT_EQ(1u, cpp_stats().frees);
}

TEST_P(CppApi, ExplicitDeallocationConsumesTheHandle) {
  stream s = cpp_->create_stream();
  buffer b = cpp_->allocate_async(1024, s);
  b.deallocate_async(s);
  EXPECT_FALSE(b);
  s.synchronize();
  EXPECT_EQ(1u, cpp_stats().frees);
}

TEST_P(CppApi, OutOfMemoryIsABadAllocNamingTheBytes) {
  stream s = cpp_->create_stream();
  try {
    buffer b = cpp_->allocate_async(size_t{1} << 50, s);
    FAIL() << "allocated a pebibyte";
  } catch (const std::bad_alloc& e) {
    EXPECT_NE(std::string(e.what()).find("1125899906842624"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpp_->allocate_async(16, s, 3), error);
  try {
    cpp_->allocate_async(16, s, 3);
  } catch (const error& e) {
    EXPECT_EQ(ARCPOOL_STATUS_INVALID_ARGUMENT, e.status());
  }
}

TEST_P(CppApi, AViewHoldsAReferenceButNoClaim) {
  stream s = cpp_->create_stream();
  buffer_view v;
  {
    buffer b = cpp_->allocate_async(8192, s);
    v = b.view(4096, 1024);
    EXPECT_EQ(static_cast<char*>(b.data()) + 4096, v.data());
    EXPECT_EQ(1024u, v.size());
    EXPECT_TRUE(b.is_terminal()) << "the view is not an owner";
  }
  // The buffer's claim went: the view still reads its record, which answers deallocated.
  EXPECT_THROW(v.data(), error);
}

TEST_P(CppApi, ExportHandsTheMemoryToTheCaller) {
  stream s = cpp_->create_stream();
  buffer b = cpp_->allocate_async(4096, s);
  void* p = std::move(b).export_pointer();
  EXPECT_NE(nullptr, p);
  EXPECT_FALSE(b);
  EXPECT_EQ(1u, cpp_stats().exports);
  detail::from_handle(cpp_->get())->drv().pool_free(p, 4096, s);
  s.synchronize();
}

TEST_P(CppApi, BuffersOutliveTheirAllocatorObject) {
  arcpool_stream_t s = make_stream();  // not the C++ allocator's: it must outlive it
  buffer b = cpp_->allocate_async(4096, s);
  cpp_.reset();  // the live buffer keeps the underlying allocator alive
  EXPECT_NE(nullptr, b.data());
  b.deallocate_async(s);  // the last record: the allocator is torn down now
  sync(s);
}

TEST_P(CppApi, StatsReadAsJson) {
  stream s = cpp_->create_stream();
  buffer b = cpp_->allocate_async(4096, s);
  const std::string json = cpp_->stats_json();
  EXPECT_NE(json.find("\"bytes_in_use_current\": 4096"), std::string::npos) << json;
  EXPECT_NE(json.find("\"allocations\": 1"), std::string::npos) << json;
  EXPECT_EQ('{', json.front());
  EXPECT_EQ('}', json.back());
}

TEST_P(CppApi, StatsReadAsJsonAreWholeWhileAnotherThreadAddsStreams) {
  // stats_json measures the JSON, then copies it: a stream made meanwhile adds its row, and a
  // figure may gain a digit, so that the copy would be cut short (its end missing, NULs in its
  // place) unless taken again. Another thread makes streams, and allocates on them, while this
  // one reads.
  std::atomic<bool> stop{false};
  std::atomic<bool> made{false};
  std::thread maker([&] {
    for (int round = 0; round < 20 && !stop.load(); ++round) {
      std::vector<stream> streams;
      for (int i = 0; i < ARCPOOL_STREAM_STATS_ROWS && !stop.load(); ++i) {
        streams.push_back(cpp_->create_stream());
        buffer b = cpp_->allocate_async(4096 + i, streams.back());
        b.deallocate_async(streams.back());
      }
      for (stream& s : streams)
        s.synchronize();
    }
    made = true;
  });
  size_t reads = 0;
  std::string cut;
  while (!made.load() && cut.empty()) {
    const std::string json = cpp_->stats_json();
    if (json.empty() || json.find('\0') != std::string::npos || json.back() != '}') cut = json;
    ++reads;
  }
  stop = true;
  maker.join();
  const std::string text = cut.substr(0, cut.find('\0'));
  EXPECT_TRUE(cut.empty()) << "read " << reads << " whole, then one of " << cut.size()
                           << " bytes cut short after " << text.size() << ": ..."
                           << text.substr(text.size() > 80 ? text.size() - 80 : 0);
}

TEST_P(CppApi, MemorySnapshotNeedsTheHistoryAndAnExportedBlockLeavesIt) {
  EXPECT_THROW(cpp_->memory_snapshot(), error) << "created without history";
  allocator_options options;
  options.driver = GetParam();
  options.history_entries = 16;
  allocator recording(options);
  stream s = recording.create_stream();
  buffer kept = recording.allocate_async(4096, s);
  buffer b = recording.allocate_async(8192, s);
  void* p = std::move(b).export_pointer();
  const pickled snap = parse_pickle(recording.memory_snapshot());
  ASSERT_EQ(1u, snap["segments"].items.size()) << "the exported block is not arcpool's";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(kept.data()), snap["segments"].items[0]["address"].number);
  const pickled& last = snap["device_traces"].items.back().items.back();
  EXPECT_EQ("segment_free", last["action"].text);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p), last["addr"].number);
  detail::from_handle(recording.get())->drv().pool_free(p, 8192, s);
  kept.deallocate_async(s);
  s.synchronize();
}

ARCPOOL_INSTANTIATE_FOR_DRIVERS(CppApi);

}  // namespace
}  // namespace arcpool::test
