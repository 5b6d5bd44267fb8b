// Code built with --default-stream per-thread: the runtime's _ptsz entry points, where the
// handle 0 is the calling thread's per-thread default stream (programming guide, "Default
// Stream"). This file defines CUDA_API_PER_THREAD_DEFAULT_STREAM before the runtime header.
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1

#include <thread>

#include "conformance.hpp"

namespace conformance {
namespace {

using PerThreadDefaultStream = Conformance;

TEST_F(PerThreadDefaultStream, ZeroIsTheCallingThreadsOwnStream) {
  words w;
  unsigned long long zero = 0, per_thread = 0, legacy = 0;
  ASSERT_EQ(cudaSuccess, cudaStreamGetId(0, &zero));
  ASSERT_EQ(cudaSuccess, cudaStreamGetId(cudaStreamPerThread, &per_thread));
  ASSERT_EQ(cudaSuccess, cudaStreamGetId(cudaStreamLegacy, &legacy));
  EXPECT_EQ(zero, per_thread);
  EXPECT_NE(zero, legacy);
  w.gate(cudaStreamPerThread, 0);
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaSuccess, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ASSERT_EQ(cudaSuccess, cudaEventRecord(e, 0));  // this thread's held stream
  unsigned long long theirs = 0;
  cudaError_t their_query = cudaSuccess;
  std::thread([&] {
    cudaSetDevice(0);
    EXPECT_EQ(cudaSuccess, cudaStreamGetId(0, &theirs));
    cudaEvent_t f = nullptr;
    EXPECT_EQ(cudaSuccess, cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
    EXPECT_EQ(cudaSuccess, cudaEventRecord(f, 0));
    EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(0));
    their_query = cudaEventQuery(f);
    cudaEventDestroy(f);
  }).join();
  EXPECT_NE(zero, theirs);
  EXPECT_EQ(cudaSuccess, their_query) << "another thread's stream 0 is not held by this one's";
  w.settle();
  EXPECT_EQ(cudaErrorNotReady, cudaEventQuery(e));
  cudaGetLastError();
  w.open(0);
  EXPECT_EQ(cudaSuccess, cudaStreamSynchronize(0));
  EXPECT_EQ(cudaSuccess, cudaEventQuery(e));
  cudaEventDestroy(e);
}

}  // namespace
}  // namespace conformance
