// Stream capture, memory pools, devices and page-locked memory, as the CUDA Runtime API
// reference and the programming guide describe them.
#include <cuda.h>

#include <cstdio>
#include <thread>

#include "conformance.hpp"

namespace conformance {
namespace {

using Capture = Conformance;
using Pools = Conformance;
using Devices = Conformance;

cudaStream_t make_stream(unsigned flags = cudaStreamNonBlocking) {
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&s, flags));
  return s;
}

cudaStreamCaptureStatus capture_status(cudaStream_t s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaSuccess, cudaStreamIsCapturing(s, &status));
  return status;
}

TEST_F(Capture, BeginAndEndMakeAGraph) {
  cudaStream_t s = make_stream();
  EXPECT_EQ(cudaStreamCaptureStatusNone, capture_status(s));
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(cudaStreamCaptureStatusActive, capture_status(s));
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamEndCapture(s, &graph));
  EXPECT_NE(nullptr, graph);
  EXPECT_EQ(cudaStreamCaptureStatusNone, capture_status(s));
  EXPECT_EQ(cudaSuccess, cudaGraphDestroy(graph));
  EXPECT_EQ(cudaErrorStreamCaptureUnsupported,
            cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal))
      << "capture may not be initiated on the legacy stream";
  cudaGetLastError();
  cudaStreamDestroy(s);
}

TEST_F(Capture, SynchronizingACapturingStreamInvalidatesTheCapture) {
  cudaStream_t s = make_stream();
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  EXPECT_EQ(cudaErrorStreamCaptureUnsupported, cudaStreamSynchronize(s));
  EXPECT_EQ(cudaStreamCaptureStatusInvalidated, capture_status(s));
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &graph));
  EXPECT_EQ(nullptr, graph);
  EXPECT_EQ(cudaStreamCaptureStatusNone, capture_status(s));
  cudaGetLastError();
  cudaStreamDestroy(s);
}

TEST_F(Capture, TheLegacyStreamIsUnusableWhileABlockingStreamCaptures) {
  cudaStream_t blocking = make_stream(cudaStreamDefault);
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(blocking, cudaStreamCaptureModeThreadLocal));
  cudaStreamCaptureStatus status;
  EXPECT_EQ(cudaErrorStreamCaptureImplicit, cudaStreamIsCapturing(cudaStreamLegacy, &status));
  EXPECT_EQ(cudaStreamCaptureStatusActive, capture_status(blocking)) << "not invalidated";
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(blocking, &graph));
  cudaGraphDestroy(graph);
  cudaGetLastError();
  cudaStreamDestroy(blocking);
}

TEST_F(Capture, CudaMallocIsProhibitedByTheCapturingThreadsCaptureUnlessRelaxed) {
  cudaStream_t s = make_stream();
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  // Another thread in global mode is prohibited too (a concurrent global capture).
  cudaError_t other = cudaSuccess;
  std::thread([&] {
    cudaSetDevice(0);
    void* p = nullptr;
    other = cudaMalloc(&p, 256);
    if (p != nullptr) cudaFree(p);
    cudaGetLastError();
  }).join();
  EXPECT_EQ(cudaErrorStreamCaptureUnsupported, other);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(s, &graph));
  cudaGetLastError();

  // Thread-local capture: other threads are not prohibited; relaxed mode lifts it here.
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  std::thread([&] {
    cudaSetDevice(0);
    void* p = nullptr;
    other = cudaMalloc(&p, 256);
    if (p != nullptr) cudaFree(p);
  }).join();
  EXPECT_EQ(cudaSuccess, other);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(cudaStreamCaptureModeGlobal, mode) << "the previous mode comes back";
  void* p = nullptr;
  EXPECT_EQ(cudaSuccess, cudaMalloc(&p, 256));
  EXPECT_EQ(cudaStreamCaptureStatusActive, capture_status(s));
  cudaThreadExchangeStreamCaptureMode(&mode);
  EXPECT_EQ(cudaSuccess, cudaStreamEndCapture(s, &graph));
  cudaGraphDestroy(graph);
  mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaFree(p);
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaStreamDestroy(s);
}

TEST_F(Capture, EndingAThreadLocalCaptureFromAnotherThreadIsRefused) {
  cudaStream_t s = make_stream();
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaError_t other = cudaSuccess;
  std::thread([&] {
    cudaSetDevice(0);
    cudaGraph_t g = nullptr;
    other = cudaStreamEndCapture(s, &g);
    cudaGetLastError();
  }).join();
  EXPECT_EQ(cudaErrorStreamCaptureWrongThread, other);
  // The refused end still ends the capture (seen on an H200, CUDA 13.0, driver 580.159.04:
  // bench/results/2026-12-04-h200): the stream captures no more, and its own thread's end
  // finds no capture to end.
  EXPECT_EQ(cudaStreamCaptureStatusNone, capture_status(s));
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaErrorIllegalState, cudaStreamEndCapture(s, &graph));
  EXPECT_EQ(nullptr, graph);
  cudaGetLastError();
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

cudaMemPool_t make_pool(size_t max_size,
                        cudaMemAllocationHandleType handle_types = cudaMemHandleTypeNone) {
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  props.maxSize = max_size;
  props.handleTypes = handle_types;
  cudaMemPool_t pool = nullptr;
  EXPECT_EQ(cudaSuccess, cudaMemPoolCreate(&pool, &props));
  return pool;
}

/// Expects `result` (of a call made while `s` captured in thread-local mode) to be a refused
/// potentially unsafe call that invalidated the capture, then ends the capture.
void expect_unsafe_then_end(cudaError_t result, cudaStream_t s) {
  cudaGetLastError();
  EXPECT_EQ(cudaErrorStreamCaptureUnsupported, result);
  EXPECT_EQ(cudaStreamCaptureStatusInvalidated, capture_status(s));
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(s, &graph);
  cudaGetLastError();
  if (graph != nullptr) cudaGraphDestroy(graph);
}

// cudaStreamBeginCapture: in global or thread-local mode, "this thread is prohibited from
// potentially unsafe API calls". The Runtime API does not list them; on an H200 (CUDA 13.0,
// driver 580.159.04: bench/results/2026-12-04-h200) an allocation from a pool on a stream that
// is not capturing was one: refused with cudaErrorStreamCaptureUnsupported, and the capture
// invalidated. In relaxed mode it runs and the capture goes on.
TEST_F(Capture, APoolAllocationOnAnotherStreamIsUnsafeUnlessRelaxed) {
  cudaStream_t s = make_stream(), t = make_stream();
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaSuccess, cudaDeviceGetDefaultMemPool(&pool, 0));
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
  void* p = nullptr;
  EXPECT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, 256, pool, t)) << "relaxed";
  EXPECT_EQ(cudaSuccess, cudaFreeAsync(p, t)) << "relaxed";
  ASSERT_EQ(cudaSuccess, cudaThreadExchangeStreamCaptureMode(&mode));
  EXPECT_EQ(cudaStreamCaptureStatusActive, capture_status(s));
  p = nullptr;
  expect_unsafe_then_end(cudaMallocFromPoolAsync(&p, 256, pool, t), s);
  if (p != nullptr) cudaFreeAsync(p, t);
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(t));
  cudaStreamDestroy(s);
  cudaStreamDestroy(t);
}

// The same rule for a pool free on a stream that is not capturing.
TEST_F(Capture, APoolFreeOnAnotherStreamIsUnsafe) {
  cudaStream_t s = make_stream(), t = make_stream();
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocAsync(&p, 256, t));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(t));
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const cudaError_t freed = cudaFreeAsync(p, t);
  expect_unsafe_then_end(freed, s);
  if (freed != cudaSuccess) {
    EXPECT_EQ(cudaSuccess, cudaFreeAsync(p, t));
  }
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(t));
  cudaStreamDestroy(s);
  cudaStreamDestroy(t);
}

// The same rule for cudaMemPoolExportPointer (seen refused on an H200, bench/results/
// 2026-12-04-h200). Relaxed, the export of this test answered cudaErrorInvalidValue there, while
// arcpool's exporter, relaxed, exported during a capture of the allocation's own stream: not
// understood, so arcpool refuses a send before it exports, and this test checks only the rule.
TEST_F(Capture, ExportingAPointerIsUnsafe) {
  cudaMemPool_t pool = make_pool(0, cudaMemHandleTypePosixFileDescriptor);
  ASSERT_NE(nullptr, pool);
  cudaStream_t s = make_stream(), t = make_stream();
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, 1 << 20, pool, t));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(t));
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  cudaMemPoolPtrExportData data{};
  expect_unsafe_then_end(cudaMemPoolExportPointer(&data, p), s);
  EXPECT_EQ(cudaSuccess, cudaFreeAsync(p, t));
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(t));
  cudaStreamDestroy(s);
  cudaStreamDestroy(t);
  cudaMemPoolDestroy(pool);
}

/// Two streams and an event recorded on `s` in a capture begun there (and on `t` too when
/// `capture_t`); ends what still captures and destroys them all when it goes.
struct captured_event {
  cudaStream_t s = make_stream(), t = make_stream();
  cudaEvent_t e = nullptr;

  explicit captured_event(bool capture_t = false) {
    EXPECT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    EXPECT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (capture_t) {
      EXPECT_EQ(cudaSuccess, cudaStreamBeginCapture(t, cudaStreamCaptureModeThreadLocal));
    }
    EXPECT_EQ(cudaSuccess, cudaEventRecord(e, s));
  }
  ~captured_event() {
    for (cudaStream_t c : {s, t}) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      if (cudaStreamIsCapturing(c, &status) != cudaSuccess || status == cudaStreamCaptureStatusNone)
        continue;
      cudaGraph_t graph = nullptr;
      cudaStreamEndCapture(c, &graph);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
    cudaGetLastError();
    cudaEventDestroy(e);
    cudaStreamDestroy(s);
    cudaStreamDestroy(t);
  }
};

// "It is invalid to synchronize or query the execution status of a stream which is being
// captured or a captured event" and "When an invalid operation is attempted during stream
// capture, any associated capture graphs are invalidated" (programming guide, "Prohibited and
// Unhandled Operations", "Invalidation").
TEST_F(Capture, AQueryOfAnEventRecordedInACaptureIsRefusedAndInvalidatesIt) {
  captured_event c;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // the refusal is not the mode's
  cudaThreadExchangeStreamCaptureMode(&mode);
  EXPECT_NE(cudaSuccess, cudaEventQuery(c.e));
  cudaThreadExchangeStreamCaptureMode(&mode);
  cudaGetLastError();
  EXPECT_EQ(cudaStreamCaptureStatusInvalidated, capture_status(c.s));
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaErrorStreamCaptureInvalidated, cudaStreamEndCapture(c.s, &graph));
  EXPECT_EQ(nullptr, graph);
}

// "When a capture graph is invalidated, further use of any streams which are being captured or
// captured events associated with the graph is invalid and will return an error" (programming
// guide, "Invalidation"); and "Stream capture can be used on any CUDA stream except
// cudaStreamLegacy", which therefore cannot join a capture by waiting on its event.
TEST_F(Capture, AWaitOnAnEventOfAnInvalidatedCaptureOrFromTheLegacyStreamFails) {
  captured_event c;
  EXPECT_NE(cudaSuccess, cudaStreamWaitEvent(cudaStreamLegacy, c.e, 0));
  cudaGetLastError();
  EXPECT_EQ(cudaErrorStreamCaptureUnsupported, cudaStreamSynchronize(c.s));  // invalidates
  cudaGetLastError();
  EXPECT_NE(cudaSuccess, cudaStreamWaitEvent(c.t, c.e, 0));
  cudaGetLastError();
  EXPECT_EQ(cudaStreamCaptureStatusNone, capture_status(c.t)) << "t joined an invalidated capture";
}

// "It is invalid to merge two separate capture graphs by waiting on a captured event from a
// stream which is being captured and is associated with a different capture graph" (programming
// guide); cudaErrorStreamCaptureMerge: "The operation would have resulted in a merge of two
// independent capture sequences" (driver_types.h).
TEST_F(Capture, AWaitThatWouldMergeTwoCapturesFails) {
  captured_event c(/*capture_t=*/true);
  EXPECT_EQ(cudaErrorStreamCaptureMerge, cudaStreamWaitEvent(c.t, c.e, 0));
  cudaGetLastError();
}

uint64_t attribute(cudaMemPool_t pool, cudaMemPoolAttr attr) {
  uint64_t v = 0;
  EXPECT_EQ(cudaSuccess, cudaMemPoolGetAttribute(pool, attr, &v));
  return v;
}

TEST_F(Pools, AMaximumSizeIsAHardLimit) {
  cudaMemPool_t pool = make_pool(size_t{64} << 20);
  cudaStream_t s = make_stream();
  void* p = nullptr;
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMallocFromPoolAsync(&p, size_t{128} << 20, pool, s));
  cudaGetLastError();
  EXPECT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, size_t{1} << 20, pool, s));
  EXPECT_GE(attribute(pool, cudaMemPoolAttrUsedMemCurrent), uint64_t{1} << 20);
  EXPECT_EQ(cudaSuccess, cudaFreeAsync(p, s));
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  cudaStreamDestroy(s);
  cudaMemPoolDestroy(pool);
}

// cudaMallocFromPoolAsync: "During stream capture, this function results in the creation of an
// allocation node. [...] The memory pool's properties are used to set the node's creation
// parameters." cudaMemAllocNodeParams: "handleTypes must be cudaMemHandleTypeNone. IPC is not
// supported." The error code is not documented: any failure passes.
TEST_F(Pools, AShareablePoolMakesNoGraphAllocation) {
  cudaMemPool_t pool = make_pool(0, cudaMemHandleTypePosixFileDescriptor);
  cudaStream_t s = make_stream();
  ASSERT_EQ(cudaSuccess, cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  void* p = nullptr;
  EXPECT_NE(cudaSuccess, cudaMallocFromPoolAsync(&p, size_t{1} << 20, pool, s));
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(s, &graph);  // invalidated or not: undocumented
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
  cudaStreamDestroy(s);
  cudaMemPoolDestroy(pool);
}

TEST_F(Pools, AttributesHaveTheirDocumentedTypes) {
  cudaMemPool_t pool = make_pool(0);
  int flag = 0;
  ASSERT_EQ(cudaSuccess,
            cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &flag));
  flag = 1;
  ASSERT_EQ(cudaSuccess,
            cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &flag));
  EXPECT_EQ(0, flag);
  uint64_t threshold = uint64_t{1} << 30;
  ASSERT_EQ(cudaSuccess,
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  EXPECT_EQ(threshold, attribute(pool, cudaMemPoolAttrReleaseThreshold));
  uint64_t nonzero = 5;
  EXPECT_EQ(cudaErrorInvalidValue,
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &nonzero))
      << "a high watermark can only be reset to zero";
  EXPECT_NE(cudaSuccess, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &nonzero))
      << "the current figures are read-only";
  cudaGetLastError();
  cudaMemPool_t current = nullptr, fallback = nullptr;
  ASSERT_EQ(cudaSuccess, cudaDeviceGetMemPool(&current, 0));
  ASSERT_EQ(cudaSuccess, cudaDeviceGetDefaultMemPool(&fallback, 0));
  EXPECT_EQ(current, fallback) << "the current pool starts as the default pool";
  cudaMemPoolDestroy(pool);
}

TEST_F(Pools, TrimReleasesOnlyFreesThatCompleted) {
  words w;
  cudaMemPool_t pool = make_pool(0);
  uint64_t keep_all = UINT64_MAX;
  ASSERT_EQ(cudaSuccess, cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
  cudaStream_t s = make_stream();
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, size_t{4} << 20, pool, s));
  w.gate(s, 0);
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, s));
  ASSERT_EQ(cudaSuccess, cudaMemPoolTrimTo(pool, 0));
  EXPECT_GE(attribute(pool, cudaMemPoolAttrReservedMemCurrent), uint64_t{4} << 20)
      << "the free has not run: its memory is outstanding";
  w.open(0);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  ASSERT_EQ(cudaSuccess, cudaMemPoolTrimTo(pool, 0));
  EXPECT_EQ(0u, attribute(pool, cudaMemPoolAttrReservedMemCurrent));
  cudaStreamDestroy(s);
  cudaMemPoolDestroy(pool);
}

TEST_F(Pools, TheReleaseThresholdAppliesAtSynchronization) {
  cudaMemPool_t pool = make_pool(0);  // threshold 0: release everything it can
  cudaStream_t s = make_stream();
  void* p = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, size_t{4} << 20, pool, s));
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, s));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  EXPECT_EQ(0u, attribute(pool, cudaMemPoolAttrReservedMemCurrent));
  cudaStreamDestroy(s);
  cudaMemPoolDestroy(pool);
}

// With every reuse policy off (cudaMemPoolReuse*: each "allow"s a reuse the pool would not
// make otherwise), a block whose free is queued behind held work is lent to no other stream:
// a pool at its maximum size refuses until the free ran. 64 MiB: on an H200 a pool of 4 MiB
// held two live blocks of 3 MiB (bench/results/2026-12-04-h200); a small maximum is not exact.
TEST_F(Pools, AFullPoolWithoutReusePoliciesWaitsForAQueuedFree) {
  words w;
  cudaMemPool_t pool = make_pool(size_t{64} << 20);
  int off = 0;
  for (cudaMemPoolAttr attr :
       {cudaMemPoolReuseFollowEventDependencies, cudaMemPoolReuseAllowOpportunistic,
        cudaMemPoolReuseAllowInternalDependencies}) {
    ASSERT_EQ(cudaSuccess, cudaMemPoolSetAttribute(pool, attr, &off));
  }
  cudaStream_t a = make_stream(), b = make_stream();
  constexpr size_t kBytes = size_t{40} << 20;  // two do not fit
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, kBytes, pool, a));
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMallocFromPoolAsync(&q, kBytes, pool, b))
      << "the first block is live";
  cudaGetLastError();
  w.gate(a, 0);
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, a));
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMallocFromPoolAsync(&q, kBytes, pool, b))
      << "its free is queued behind the gate";
  cudaGetLastError();
  w.open(0);
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(a));
  if (q == nullptr) {
    EXPECT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&q, kBytes, pool, b));
  }
  EXPECT_EQ(cudaSuccess, cudaFreeAsync(q, b));
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(b));
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaMemPoolDestroy(pool);
}

// The runtime makes a thread's primary context current at its first call that needs one
// (cudaSetDevice does since CUDA 12.0); until then the thread has none, and driver API calls
// on it fail with CUDA_ERROR_INVALID_CONTEXT (seen on an H200: bench/results/2026-12-04-h200).
TEST_F(Devices, ANewThreadHasNoCurrentContextUntilItsFirstRuntimeCall) {
  // Looks cuCtxGetCurrent up here: the lookup is a runtime call of its own.
  ASSERT_NE(nullptr, arcpool::test::current_context()) << "the fixture's calls made it current";
  std::thread([&] {
    EXPECT_EQ(nullptr, arcpool::test::current_context()) << "no runtime call on this thread yet";
    EXPECT_EQ(cudaSuccess, cudaSetDevice(0));
    EXPECT_NE(nullptr, arcpool::test::current_context());
  }).join();
}

// Whether cudaStreamIsCapturing, given a created stream, needs a current context (and so makes
// one current, "If no CUcontext is current [...] when a CUDA Runtime API call which requires an
// active context is made") is not in the Runtime API reference. arcpool's capture check runs
// under a device guard (cuCtxGetCurrent), which on the H200 was half of the cached pair's four
// runtime calls (docs/performance.md): if a runtime answers on a thread with no context and
// binds none, the check on a created or registered stream needs no guard. Prints the answer.
TEST_F(Devices, ACaptureQueryOnAThreadWithNoContextAnswersAndMayMakeOneCurrent) {
  cudaStream_t s = make_stream();
  ASSERT_NE(nullptr, arcpool::test::current_context()) << "the fixture's calls made it current";
  cudaError_t asked = cudaErrorUnknown;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  bool bound = false;
  std::thread([&] {
    EXPECT_EQ(nullptr, arcpool::test::current_context()) << "no runtime call on this thread yet";
    asked = cudaStreamIsCapturing(s, &status);
    bound = arcpool::test::current_context() != nullptr;
    cudaGetLastError();
  }).join();
  std::printf(
      "[probe] cudaStreamIsCapturing of a created stream on a thread with no current context: "
      "%s; the thread's context afterwards: %s\n",
      cudaGetErrorName(asked), bound ? "made current by the call" : "none");
  RecordProperty("stream_is_capturing_without_context", cudaGetErrorName(asked));
  RecordProperty("stream_is_capturing_binds_context", bound ? "yes" : "no");
  if (asked == cudaSuccess) {
    EXPECT_EQ(cudaStreamCaptureStatusNone, status) << "the stream does not capture";
  }
  cudaStreamDestroy(s);
}

TEST_F(Pools, AnOwnedPoolWithoutInternalDependenciesInsertsNoHiddenWait) {
  CONFORMANCE_SIMCUDA_ONLY();
  words w;
  cudaMemPool_t pool = make_pool(0);
  int off = 0;
  ASSERT_EQ(cudaSuccess,
            cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &off));
  cudaStream_t a = make_stream(), b = make_stream();
  void* p = nullptr;
  void* q = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&p, 1 << 20, pool, a));
  w.gate(a, 0);
  ASSERT_EQ(cudaSuccess, cudaFreeAsync(p, a));
  const uint64_t before = simcuda_hidden_waits();
  ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&q, 1 << 20, pool, b));
  EXPECT_NE(p, q) << "the free is not ordered before b and has not run";
  EXPECT_EQ(before, simcuda_hidden_waits());
  // With internal dependencies, the most recent free is reused behind a hidden wait.
  int on = 1;
  ASSERT_EQ(cudaSuccess,
            cudaMemPoolSetAttribute(pool, cudaMemPoolReuseAllowInternalDependencies, &on));
  void* r = nullptr;
  ASSERT_EQ(cudaSuccess, cudaMallocFromPoolAsync(&r, 1 << 20, pool, b));
  EXPECT_EQ(p, r);
  EXPECT_EQ(before + 1, simcuda_hidden_waits());
  w.mark(b, 1);
  w.settle();
  EXPECT_FALSE(w.reached(1)) << "b waits for a's free";
  w.open(0);
  cudaFreeAsync(q, b);
  cudaFreeAsync(r, b);
  cudaStreamSynchronize(b);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  cudaMemPoolDestroy(pool);
}

TEST_F(Devices, ContextsAreCreatedBySetDeviceNotByGetDevice) {
  CONFORMANCE_SIMCUDA_ONLY();
  int count = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&count));
  ASSERT_GE(count, 2) << "simcuda models 2 devices by default";
  std::thread([&] {
    int d = -1;
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&d));
    EXPECT_EQ(0, d) << "a new thread's current device is 0";
    EXPECT_EQ(0u, simcuda_primary_contexts(1)) << "nothing touched device 1 yet";
    ASSERT_EQ(cudaSuccess, cudaSetDevice(1));
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&d));
    EXPECT_EQ(1, d);
  }).join();
  EXPECT_EQ(1u, simcuda_primary_contexts(1)) << "cudaSetDevice(1) created device 1's context";
  EXPECT_EQ(cudaErrorInvalidDevice, cudaSetDevice(count));
  cudaGetLastError();
}

// Runtime API, "Interactions with the CUDA Driver API": "CUDA Runtime API calls operate on the
// CUDA Driver API CUcontext which is current to the calling host thread"; cudaSetDevice makes
// the device's primary context current "by calling cuCtxSetCurrent()"; "If no CUcontext is
// current to the calling thread when a CUDA Runtime API call which requires an active context
// is made, then the primary context for a device will be selected, made current to the
// calling thread, and initialized." cuCtxSetCurrent(NULL) pops the thread's context.
TEST_F(Devices, TheCurrentContextIsPerThreadAndTheRuntimeFollowsIt) {
  const auto get = driver_function<CUresult(CUDAAPI*)(CUcontext*)>("cuCtxGetCurrent");
  const auto set = driver_function<CUresult(CUDAAPI*)(CUcontext)>("cuCtxSetCurrent");
  ASSERT_NE(nullptr, get);
  ASSERT_NE(nullptr, set);
  int count = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&count));
  std::thread([&] {
    CUcontext ctx = reinterpret_cast<CUcontext>(1);
    ASSERT_EQ(CUDA_SUCCESS, get(&ctx));
    EXPECT_EQ(nullptr, ctx) << "a new thread has no current context";
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    CUcontext zero = nullptr;
    ASSERT_EQ(CUDA_SUCCESS, get(&zero));
    ASSERT_NE(nullptr, zero);
    ASSERT_EQ(CUDA_SUCCESS, set(nullptr));
    ASSERT_EQ(CUDA_SUCCESS, get(&ctx));
    EXPECT_EQ(nullptr, ctx) << "cuCtxSetCurrent(NULL) leaves none current";
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreate(&s));
    ASSERT_EQ(CUDA_SUCCESS, get(&ctx));
    EXPECT_NE(nullptr, ctx) << "a runtime call made a primary context current";
    cudaStreamDestroy(s);
    if (count >= 2) {
      ASSERT_EQ(cudaSuccess, cudaSetDevice(1));
      CUcontext one = nullptr;
      ASSERT_EQ(CUDA_SUCCESS, get(&one));
      EXPECT_NE(zero, one) << "each device has its primary context";
      ASSERT_EQ(CUDA_SUCCESS, set(zero));
      int d = -1;
      ASSERT_EQ(cudaSuccess, cudaGetDevice(&d));
      EXPECT_EQ(0, d) << "the runtime's device is the current context's";
    }
  }).join();
}

// The runtime's own per-thread device, as simcuda models it (docs/simcuda.md): cudaSetDevice
// sets it, and popping the context with cuCtxSetCurrent(NULL) does not put it back, so the
// thread's next runtime call that needs a context takes that device's. The Runtime API says
// only "a device"; this test is where a GPU run confirms or refutes simcuda's choice.
TEST_F(Devices, PoppingTheContextKeepsTheRuntimesOwnDevice) {
  const auto get = driver_function<CUresult(CUDAAPI*)(CUcontext*)>("cuCtxGetCurrent");
  const auto set = driver_function<CUresult(CUDAAPI*)(CUcontext)>("cuCtxSetCurrent");
  ASSERT_NE(nullptr, get);
  ASSERT_NE(nullptr, set);
  int count = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "needs two devices";
  std::thread([&] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(1));
    ASSERT_EQ(CUDA_SUCCESS, set(nullptr));
    CUcontext ctx = nullptr;
    ASSERT_EQ(CUDA_SUCCESS, get(&ctx));
    EXPECT_EQ(nullptr, ctx);
    ASSERT_EQ(cudaSuccess, cudaFree(nullptr));  // needs a context: the runtime picks one
    int d = -1;
    ASSERT_EQ(cudaSuccess, cudaGetDevice(&d));
    EXPECT_EQ(1, d) << "the runtime picked another device than its own after the pop";
  }).join();
}

// cuEventRecord: "hEvent and hStream must be from the same context otherwise
// CUDA_ERROR_INVALID_HANDLE is returned" (cudaEventRecord: "event and stream must be on the same
// CUDA context"); cuStreamGetCtx returns "the context that was active in the calling thread
// when the stream was created"; cuStreamWaitEvent: "hEvent may be from a different context or
// device than hStream".
TEST_F(Devices, AnEventIsRecordedOnlyOnAStreamOfItsOwnContext) {
  using create_fn = CUresult(CUDAAPI*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice);
  const auto create = driver_function<create_fn>("cuCtxCreate", 13000);
  const auto destroy = driver_function<CUresult(CUDAAPI*)(CUcontext)>("cuCtxDestroy");
  const auto get = driver_function<CUresult(CUDAAPI*)(CUcontext*)>("cuCtxGetCurrent");
  const auto set = driver_function<CUresult(CUDAAPI*)(CUcontext)>("cuCtxSetCurrent");
  const auto stream_ctx =
      driver_function<CUresult(CUDAAPI*)(CUstream, CUcontext*)>("cuStreamGetCtx");
  ASSERT_TRUE(create && destroy && get && set && stream_ctx);
  std::thread([&] {
    ASSERT_EQ(cudaSuccess, cudaSetDevice(0));
    CUcontext primary = nullptr;
    ASSERT_EQ(CUDA_SUCCESS, get(&primary));
    CUctxCreateParams params{};
    CUcontext other = nullptr;
    ASSERT_EQ(CUDA_SUCCESS, create(&other, &params, 0, 0));
    CUcontext now = nullptr;
    ASSERT_EQ(CUDA_SUCCESS, get(&now));
    EXPECT_EQ(other, now) << "cuCtxCreate makes the new context current";
    cudaStream_t theirs = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&theirs, cudaStreamNonBlocking));
    ASSERT_EQ(CUDA_SUCCESS, set(primary));
    cudaStream_t ours = nullptr;
    ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&ours, cudaStreamNonBlocking));
    cudaEvent_t event = nullptr;
    ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&event, cudaEventDisableTiming));

    CUcontext of = nullptr;
    ASSERT_EQ(CUDA_SUCCESS, stream_ctx(reinterpret_cast<CUstream>(theirs), &of));
    EXPECT_EQ(other, of);
    ASSERT_EQ(CUDA_SUCCESS, stream_ctx(reinterpret_cast<CUstream>(ours), &of));
    EXPECT_EQ(primary, of);
    EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventRecord(event, theirs));
    cudaGetLastError();
    EXPECT_EQ(cudaSuccess, cudaEventRecord(event, ours));
    EXPECT_EQ(cudaSuccess, cudaStreamWaitEvent(theirs, event, 0));
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(theirs));

    EXPECT_EQ(cudaSuccess, cudaEventDestroy(event));
    EXPECT_EQ(cudaSuccess, cudaStreamDestroy(ours));
    ASSERT_EQ(CUDA_SUCCESS, set(other));
    EXPECT_EQ(cudaSuccess, cudaStreamDestroy(theirs));
    EXPECT_EQ(CUDA_SUCCESS, destroy(other));
  }).join();
}

TEST_F(Devices, MemoryInfoAndOutOfMemoryAtCapacity) {
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaSuccess, cudaMemGetInfo(&free_bytes, &total));
  EXPECT_GT(total, 0u);
  EXPECT_LE(free_bytes, total);
  void* p = nullptr;
  EXPECT_EQ(cudaErrorMemoryAllocation, cudaMalloc(&p, total + (size_t{1} << 30)));
  cudaGetLastError();
}

TEST_F(Devices, PageLockedMemoryIsMappedAtTheSameAddress) {
  void* host = nullptr;
  ASSERT_EQ(cudaSuccess, cudaHostAlloc(&host, 4096, cudaHostAllocMapped));
  void* device = nullptr;
  ASSERT_EQ(cudaSuccess, cudaHostGetDevicePointer(&device, host, 0));
  EXPECT_EQ(host, device) << "unified addressing";
  EXPECT_EQ(cudaSuccess, cudaFreeHost(host));
}

TEST_F(Devices, PoolAccessCanBeGrantedToAPeer) {
  int count = 0;
  ASSERT_EQ(cudaSuccess, cudaGetDeviceCount(&count));
  if (count < 2) GTEST_SKIP() << "one device: peer access needs two";
  cudaMemPool_t pool = make_pool(0);
  cudaMemAccessDesc access{};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = 1;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  EXPECT_EQ(cudaSuccess, cudaMemPoolSetAccess(pool, &access, 1));
  access.location.id = count;
  EXPECT_NE(cudaSuccess, cudaMemPoolSetAccess(pool, &access, 1));
  cudaGetLastError();
  cudaMemPoolDestroy(pool);
}

}  // namespace
}  // namespace conformance
