// Streams, events and host functions, as the CUDA Runtime API reference describes them.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "conformance.hpp"

namespace conformance {
namespace {

using Streams = Conformance;
using Events = Conformance;

cudaStream_t make_stream(unsigned flags) {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, flags));
  return s;
}

/// Waits up to 10 s for `w` to reach word `i`.
bool eventually(const words& w, int i) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!w.reached(i)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

TEST_F(Streams, ANonBlockingStreamDoesNotWaitForTheLegacyStream) {
  words w;
  cudaStream_t free_running = make_stream(cudaStreamNonBlocking);
  cudaStream_t blocking = make_stream(cudaStreamDefault);
  w.gate(cudaStreamLegacy, 0);
  w.mark(free_running, 1);
  w.mark(blocking, 2);
  w.settle();
  EXPECT_TRUE(w.reached(1)) << "cudaStreamNonBlocking: no implicit synchronization";
  EXPECT_FALSE(w.reached(2)) << "a blocking stream waits for the legacy stream's prior work";
  w.open(0);
  EXPECT_TRUE(eventually(w, 2));
  cudaStreamDestroy(free_running);
  cudaStreamDestroy(blocking);
}

TEST_F(Streams, TheLegacyStreamWaitsForBlockingStreamsAndThePerThreadStream) {
  words w;
  cudaStream_t blocking = make_stream(cudaStreamDefault);
  w.gate(blocking, 0);
  w.mark(cudaStreamLegacy, 1);
  w.settle();
  EXPECT_FALSE(w.reached(1));
  w.open(0);
  EXPECT_TRUE(eventually(w, 1));
  w.gate(cudaStreamPerThread, 2);
  w.mark(cudaStreamLegacy, 3);
  w.settle();
  EXPECT_FALSE(w.reached(3)) << "the per-thread stream synchronizes with the legacy stream";
  w.open(2);
  EXPECT_TRUE(eventually(w, 3));
  cudaStreamDestroy(blocking);
}

TEST_F(Streams, ThePerThreadStreamIsTheCallingThreadsOwn) {
  words w;
  unsigned long long mine = 0, theirs = 0;
  ASSERT_EQ(cudaSuccess, cudaStreamGetId(cudaStreamPerThread, &mine));
  w.gate(cudaStreamPerThread, 0);
  std::thread other([&] {
    cudaSetDevice(0);
    EXPECT_EQ(cudaSuccess, cudaStreamGetId(cudaStreamPerThread, &theirs));
    w.mark(cudaStreamPerThread, 1);
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(cudaStreamPerThread));
  });
  other.join();
  EXPECT_NE(mine, theirs);
  EXPECT_TRUE(w.reached(1)) << "another thread's per-thread stream is not held by this one's";
  w.open(0);
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(cudaStreamPerThread));
}

TEST_F(Streams, StreamIdsAreUniqueInTheProcess) {
  std::vector<unsigned long long> ids;
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < 4; ++i) {
    streams.push_back(make_stream(i % 2 == 0 ? cudaStreamNonBlocking : cudaStreamDefault));
    unsigned long long id = 0;
    ASSERT_EQ(cudaSuccess, cudaStreamGetId(streams.back(), &id));
    ids.push_back(id);
  }
  unsigned long long legacy = 0, per_thread = 0;
  ASSERT_EQ(cudaSuccess, cudaStreamGetId(cudaStreamLegacy, &legacy));
  ASSERT_EQ(cudaSuccess, cudaStreamGetId(cudaStreamPerThread, &per_thread));
  ids.push_back(legacy);
  ids.push_back(per_thread);
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = i + 1; j < ids.size(); ++j)
      EXPECT_NE(ids[i], ids[j]);
  for (cudaStream_t s : streams)
    cudaStreamDestroy(s);
}

TEST_F(Streams, WorkQueuedOnADestroyedStreamStillRuns) {
  words w;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  w.gate(s, 0);
  w.mark(s, 1);
  ASSERT_EQ(cudaSuccess, cudaStreamDestroy(s));  // returns at once
  EXPECT_FALSE(w.reached(1));
  w.open(0);
  EXPECT_TRUE(eventually(w, 1));
}

// cudaDeviceSynchronize: "Blocks until the device has completed all preceding requested
// tasks", those of a stream destroyed meanwhile too, so that memory allocated there may then be
// freed on any stream. simcuda forgot the work of a destroyed stream once it had drained, and
// its race checker saw such a free unordered after the allocation.
TEST_F(Streams, ADeviceSynchronizationOrdersLaterWorkAfterADestroyedStreamsWork) {
  cudaStream_t gone = make_stream(cudaStreamNonBlocking);
  cudaStream_t later = make_stream(cudaStreamNonBlocking);
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 4096, gone));
  ASSERT_EQ(cudaSuccess, cudaStreamDestroy(gone));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the stream's resources go
  ASSERT_EQ(cudaSuccess, cudaDeviceSynchronize());
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, later));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(later));
  ASSERT_EQ(cudaSuccess, cudaStreamDestroy(later));
}

TEST_F(Streams, HostFunctionsRunInOrderAndBlockLaterWork) {
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  struct log {
    std::vector<int> order;
  } l;
  struct item {
    log* l;
    int i;
  };
  std::vector<item> items;
  items.reserve(50);
  for (int i = 0; i < 50; ++i) {
    items.push_back({&l, i});
    ASSERT_EQ(cudaSuccess, cudaLaunchHostFunc(
                               s,
                               [](void* p) {
                                 auto* it = static_cast<item*>(p);
                                 it->l->order.push_back(it->i);
                               },
                               &items.back()));
  }
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  ASSERT_EQ(50u, l.order.size());
  for (int i = 0; i < 50; ++i)
    EXPECT_EQ(i, l.order[i]);
  cudaStreamDestroy(s);
}

// cudaLaunchHostFunc: "Host functions without a mandated order (such as in independent streams)
// execute in undefined order and may be serialized." simcuda serializes them, so that code whose
// host function waits for another stream's (a deadlock on a GPU that serializes) cannot pass
// here; it ran each stream's on its own thread, in parallel.
TEST_F(Streams, HostFunctionsOfIndependentStreamsNeverOverlapOnSimcuda) {
  CONFORMANCE_SIMCUDA_ONLY();
  struct overlap {
    std::atomic<int> running{0};
    std::atomic<int> most{0};
  } o;
  auto host_function = [](void* p) {
    auto* ov = static_cast<overlap*>(p);
    const int now = ++ov->running;
    int most = ov->most.load();
    while (now > most && !ov->most.compare_exchange_weak(most, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    --ov->running;
  };
  std::vector<cudaStream_t> streams;
  for (int i = 0; i < 4; ++i)
    streams.push_back(make_stream(cudaStreamNonBlocking));
  for (int round = 0; round < 5; ++round) {
    for (cudaStream_t s : streams)
      ASSERT_EQ(cudaSuccess, cudaLaunchHostFunc(s, host_function, &o));
  }
  for (cudaStream_t s : streams)
    ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  EXPECT_EQ(1, o.most.load()) << "host functions of two streams ran at once";
  for (cudaStream_t s : streams)
    cudaStreamDestroy(s);
}

TEST_F(Events, AQueryIsNotReadyUntilTheRecordedWorkCompleted) {
  words w;
  cudaStream_t s = make_stream(cudaStreamNonBlocking);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  EXPECT_EQ(cudaSuccess, cudaEventQuery(e)) << "an event never recorded is complete";
  w.gate(s, 0);
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, s));
  w.settle();
  EXPECT_EQ(cudaErrorNotReady, cudaEventQuery(e));
  cudaGetLastError();
  w.open(0);
  EXPECT_EQ(cudaSuccess, cudaEventSynchronize(e));
  EXPECT_EQ(cudaSuccess, cudaEventQuery(e));
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

// cudaEventRecord: "event and stream must be on the same CUDA context". The legacy default
// stream (0) is the current device's: an event made on device 0 is refused on it while device 1
// is current, and taken once device 0 is current again (the programming guide, "Stream and
// Event Behavior": "cudaEventRecord() will fail if the input event and input stream are
// associated to different devices").
TEST_F(Events, ARecordOnAnotherDevicesDefaultStreamIsRefused) {
  int devices = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "needs two devices";
  std::thread([] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    cudaEvent_t e = nullptr;
    ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ASSERT_EQ(cudaSuccess, cudaSetDevice(1));
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventRecord(e, nullptr));
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventRecord(e, cudaStreamPerThread));
    cudaGetLastError();
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    EXPECT_EQ(cudaSuccess, cudaEventRecord(e, nullptr));
    EXPECT_EQ(cudaSuccess, cudaEventSynchronize(e));
    cudaEventDestroy(e);
  }).join();
}

TEST_F(Events, AWaitTakesTheEventsStateAtTheCall) {
  words w;
  cudaStream_t held = make_stream(cudaStreamNonBlocking);
  cudaStream_t idle = make_stream(cudaStreamNonBlocking);
  cudaStream_t waiter = make_stream(cudaStreamNonBlocking);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  w.gate(held, 0);
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, held));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(waiter, e, 0));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, idle));  // a later record does not move the wait
  w.mark(waiter, 1);
  w.settle();
  EXPECT_FALSE(w.reached(1));
  ASSERT_EQ(cudaSuccess, cudaEventDestroy(e));  // destroyed while the wait is pending
  w.settle();
  EXPECT_FALSE(w.reached(1)) << "the wait holds the record, not the event";
  w.open(0);
  EXPECT_TRUE(eventually(w, 1));
  for (cudaStream_t s : {held, idle, waiter})
    cudaStreamDestroy(s);
}

}  // namespace
}  // namespace conformance
