// simcuda's strictness where CUDA is undefined: the access race checker and the violations it
// names, device memory the host cannot touch, and call counters. These check simcuda itself
// (they skip on a real runtime), except the host fault, which a GPU shows too.
#include <csignal>
#include <cstring>
#include <string>

#include "conformance.hpp"

namespace conformance {
namespace {

using SimcudaRules = Conformance;

cudaStream_t make_stream() {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

TEST_F(SimcudaRules, AUseNotOrderedBeforeTheFreeIsAUseAfterFree) {
  CONFORMANCE_SIMCUDA_ONLY();
  words w;
  cudaStream_t a = make_stream(), b = make_stream();
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 4096, a));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(a));
  w.gate(b, 0);
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, 1, 4096, b));
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, a));  // b's memset is not ordered before it
  const std::string v = take_simcuda_violations();
  EXPECT_NE(std::string::npos, v.find("use after free: cudaMemsetAsync")) << v;
  EXPECT_NE(std::string::npos, v.find("is not ordered before cudaFreeAsync")) << v;
  w.open(0);
  cudaStreamSynchronize(b);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_F(SimcudaRules, AFenceOrdersTheUseBeforeTheFree) {
  CONFORMANCE_SIMCUDA_ONLY();
  words w;
  cudaStream_t a = make_stream(), b = make_stream();
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 4096, a));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, a));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(b, e, 0));  // b after the allocation
  w.gate(b, 0);
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, 1, 4096, b));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, b));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(a, e, 0));  // the free after b's use
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, a));
  EXPECT_EQ("", take_simcuda_violations());
  w.open(0);
  cudaStreamSynchronize(a);
  cudaEventDestroy(e);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_F(SimcudaRules, AUseNotOrderedAfterTheAllocationIsAUseBeforeAllocation) {
  CONFORMANCE_SIMCUDA_ONLY();
  words w;
  cudaStream_t a = make_stream(), b = make_stream();
  w.gate(a, 0);
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 4096, a));
  ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, 1, 4096, b));
  const std::string v = take_simcuda_violations();
  EXPECT_NE(std::string::npos, v.find("use before allocation: cudaMemsetAsync")) << v;
  w.open(0);
  cudaStreamSynchronize(a);
  cudaStreamSynchronize(b);
  cudaFreeAsync(p, b);  // after both synchronizations: ordered after the allocation
  cudaStreamSynchronize(b);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

TEST_F(SimcudaRules, TheHostCannotTouchDeviceMemory) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the runtime has threads
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMalloc(&p, 4096));
  EXPECT_DEATH(
      {
        std::signal(SIGSEGV, SIG_DFL);
        *static_cast<volatile char*>(p) = 1;
      },
      "");
  cudaFree(p);
}

TEST_F(SimcudaRules, ADestroyedStreamOrEventIsAViolation) {
  CONFORMANCE_SIMCUDA_ONLY();
  cudaStream_t s = make_stream();
  ASSERT_EQ(cudaSuccess, cudaStreamDestroy(s));
  EXPECT_NE(cudaSuccess, cudaStreamSynchronize(s));
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ASSERT_EQ(cudaSuccess, cudaEventDestroy(e));
  EXPECT_NE(cudaSuccess, cudaEventRecord(e, cudaStreamPerThread));
  cudaGetLastError();
  const std::string v = take_simcuda_violations();
  EXPECT_NE(std::string::npos, v.find("cudaStreamSynchronize: use of destroyed stream")) << v;
  EXPECT_NE(std::string::npos, v.find("cudaEventRecord: use of destroyed event")) << v;
}

TEST_F(SimcudaRules, ACudaCallInsideAHostFunctionIsAViolation) {
  CONFORMANCE_SIMCUDA_ONLY();
  cudaStream_t s = make_stream();
  ASSERT_EQ(cudaSuccess, cudaLaunchHostFunc(
                             s,
                             [](void*) {
                               int d = 0;
                               cudaGetDevice(&d);
                             },
                             nullptr));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  const std::string v = take_simcuda_violations();
  EXPECT_NE(std::string::npos, v.find("cudaGetDevice called from inside a host function")) << v;
  cudaStreamDestroy(s);
}

TEST_F(SimcudaRules, FreeingMemoryNoPoolHandedOutIsAViolation) {
  CONFORMANCE_SIMCUDA_ONLY();
  int local = 0;
  EXPECT_EQ(cudaErrorInvalidValue, cudaFreeAsync(&local, cudaStreamPerThread));
  cudaGetLastError();
  const std::string v = take_simcuda_violations();
  EXPECT_NE(std::string::npos, v.find("no pool handed out this pointer")) << v;
}

TEST_F(SimcudaRules, FreeingNonGraphMemoryDuringCaptureIsAViolation) {
  CONFORMANCE_SIMCUDA_ONLY();
  cudaStream_t s = make_stream();
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 4096, s));
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EXPECT_NE(cudaSuccess, cudaFreeAsync(p, s));
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &graph));
  cudaGetLastError();
  const std::string v = take_simcuda_violations();
  EXPECT_NE(std::string::npos, v.find("(non-graph memory)")) << v;
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, s));
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

// simcuda_stream_settle: the tests' settle() on simcuda (docs/simcuda.md).
// An event recorded in a capture that has ended belongs to no later capture, whatever memory
// the later one takes (simcuda once kept a pointer to the ended capture, which the next capture
// could reuse: the query then refused the event as the new capture's).
TEST_F(SimcudaRules, AnEventOfAnEndedCaptureIsNoEventOfALaterOne) {
  CONFORMANCE_SIMCUDA_ONLY();
  cudaStream_t s = make_stream(), t = make_stream();
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, s));
  cudaGraph_t first = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(s, &first));
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(t, cudaStreamCaptureModeThreadLocal));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  EXPECT_NE(cudaErrorCapturedEvent, cudaEventQuery(e));
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaGetLastError();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaSuccess, cudaStreamIsCapturing(t, &status));
  EXPECT_EQ(cudaStreamCaptureStatusActive, status);
  cudaGraph_t second = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(t, &second));
  for (cudaGraph_t g : {first, second})
    if (g != nullptr) cudaGraphDestroy(g);
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
  cudaStreamDestroy(t);
}

// cudaIpcOpenEventHandle: "Performing operations on the imported event after the exported
// event has been freed with cudaEventDestroy will result in undefined behavior". simcuda names
// it, and a handle of a destroyed event never opens a later event (here, in one process, the
// later event takes the destroyed one's file descriptor number).
TEST_F(SimcudaRules, AnInterprocessEventUsedAfterItsCreatorDestroyedItIsAViolation) {
  CONFORMANCE_SIMCUDA_ONLY();
  constexpr unsigned kFlags = cudaEventInterprocess | cudaEventDisableTiming;
  cudaEvent_t e = nullptr, opened = nullptr, later = nullptr, again = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, kFlags));
  cudaIpcEventHandle_t handle;
  ASSERT_EQ(cudaSuccess, cudaIpcGetEventHandle(&handle, e));
  ASSERT_EQ(cudaSuccess, cudaIpcOpenEventHandle(&opened, handle));
  ASSERT_EQ(cudaSuccess, cudaEventDestroy(e));
  cudaEventQuery(opened);
  std::string v = take_simcuda_violations();
  EXPECT_NE(std::string::npos, v.find("cudaEventQuery: an interprocess event opened from process"))
      << v;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&later, kFlags));
  EXPECT_EQ(cudaErrorInvalidValue, cudaIpcOpenEventHandle(&again, handle));
  cudaGetLastError();
  take_simcuda_violations();  // one when `later` took the number, as it does on Linux
  cudaEventDestroy(opened);
  cudaEventDestroy(later);
}

TEST_F(SimcudaRules, SettleReturnsOnlyWhenTheStreamCannotProgress) {
  CONFORMANCE_SIMCUDA_ONLY();
  words w;
  cudaStream_t slow = make_stream(), held = make_stream(), waiter = make_stream();
  cudaEvent_t after_slow = nullptr, after_gate = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&after_slow, cudaEventDisableTiming));
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&after_gate, cudaEventDisableTiming));
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 4096, slow));
  // Work that runs without the host (however the scheduler delays it): settle waits it out,
  // also when the stream settled only waits on it.
  for (int i = 0; i < 20; ++i)
    ASSERT_EQ(cudaSuccess, cudaMemsetAsync(p, i, 4096, slow));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(after_slow, slow));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(waiter, after_slow, 0));
  w.mark(waiter, 0);
  ASSERT_TRUE(simcuda_settle(waiter));
  EXPECT_TRUE(w.reached(0)) << "settle returned while the stream it waits on could still run";
  // Held by a gate on another stream: settle returns, and the marker behind it is unreachable.
  w.gate(held, 1);
  ASSERT_EQ(cudaSuccess, cudaEventRecord(after_gate, held));
  ASSERT_EQ(cudaSuccess, cudaStreamWaitEvent(waiter, after_gate, 0));
  w.mark(waiter, 2);
  ASSERT_TRUE(simcuda_settle(waiter));
  EXPECT_FALSE(w.reached(2));
  w.open(1);
  ASSERT_TRUE(simcuda_settle(waiter));
  EXPECT_TRUE(w.reached(2)) << "settle returned before the opened gate let the waiter run";
  EXPECT_EQ(cudaSuccess, cudaFreeAsync(p, slow));
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  cudaEventDestroy(after_slow);
  cudaEventDestroy(after_gate);
  for (cudaStream_t s : {slow, held, waiter})
    cudaStreamDestroy(s);
}

TEST_F(SimcudaRules, CallsAreCounted) {
  CONFORMANCE_SIMCUDA_ONLY();
  cudaStream_t s = make_stream();
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const uint64_t before = simcuda_calls("cudaEventRecord");
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(cudaSuccess, cudaEventRecord(e, s));
  EXPECT_EQ(before + 3, simcuda_calls("cudaEventRecord"));
  cudaEventDestroy(e);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace conformance
