// arcpool's device kernels: fill / verify / poison / spin. Grid-stride loops, 64-bit indices,
// 16-byte accesses for the body of each range, a launch check after every launch.
#include <cub/block/block_reduce.cuh>

#include "kernels.hpp"
#include "pattern.hpp"

namespace arcpool::kernels {
namespace {

constexpr int kThreads = 256;

/// A range of 32-bit words split into a scalar head (up to 16-byte alignment), a uint4 body
/// and a scalar tail.
struct word_range {
  uint32_t* words;
  uint64_t count;  // whole words
  uint64_t head;   // scalar words before the first 16-byte boundary
  uint64_t vecs;   // uint4 in the body
  uint64_t first;  // pattern index of words[0]

  __host__ static word_range of(const void* p, size_t bytes, uint64_t first_word) {
    word_range r{};
    r.words = static_cast<uint32_t*>(const_cast<void*>(p));
    r.count = bytes / 4;
    const uint64_t misalign = (reinterpret_cast<uintptr_t>(p) / 4) % 4;
    r.head = misalign == 0 ? 0 : (4 - misalign);
    if (r.head > r.count) r.head = r.count;
    r.vecs = (r.count - r.head) / 4;
    r.first = first_word;
    return r;
  }
  __device__ uint64_t tail_start() const { return head + vecs * 4; }
};

/// The kernels store whole 32-bit words: an unaligned start would be a misaligned-address
/// fault, which is sticky (the context would be lost for every later test).
bool word_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 4 == 0;
}

__device__ uint64_t global_thread() {
  return static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ uint64_t grid_threads() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x;
}

__global__ void fill_kernel(word_range r, uint32_t tag) {
  const uint64_t t = global_thread();
  uint4* body = reinterpret_cast<uint4*>(r.words + r.head);
  for (uint64_t v = t; v < r.vecs; v += grid_threads()) {
    const uint64_t i = r.first + r.head + v * 4;
    body[v] = make_uint4(pattern_word(tag, i), pattern_word(tag, i + 1), pattern_word(tag, i + 2),
                         pattern_word(tag, i + 3));
  }
  if (t < r.head) r.words[t] = pattern_word(tag, r.first + t);
  const uint64_t tail = r.tail_start() + t;
  if (tail < r.count) r.words[tail] = pattern_word(tag, r.first + tail);
}

__global__ void verify_kernel(word_range r, uint32_t tag, verify_counters* counters) {
  using reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename reduce::TempStorage scratch;
  const uint64_t t = global_thread();
  unsigned long long bad = 0;
  unsigned long long first_bad = ~0ull;
  auto check = [&](uint32_t got, uint64_t i) {
    if (got != pattern_word(tag, i)) {
      ++bad;
      if (i < first_bad) first_bad = i;
    }
  };
  const uint4* body = reinterpret_cast<const uint4*>(r.words + r.head);
  for (uint64_t v = t; v < r.vecs; v += grid_threads()) {
    const uint4 w = body[v];
    const uint64_t i = r.first + r.head + v * 4;
    check(w.x, i);
    check(w.y, i + 1);
    check(w.z, i + 2);
    check(w.w, i + 3);
  }
  if (t < r.head) check(r.words[t], r.first + t);
  const uint64_t tail = r.tail_start() + t;
  if (tail < r.count) check(r.words[tail], r.first + tail);
  if (bad != 0) atomicMin(&counters->first_bad_word, first_bad);
  const unsigned long long block_bad = reduce(scratch).Sum(bad);
  if (threadIdx.x == 0) {
    if (block_bad != 0) atomicAdd(&counters->mismatches, block_bad);
    if (blockIdx.x == 0) atomicAdd(&counters->words, static_cast<unsigned long long>(r.count));
  }
}

__global__ void poison_kernel(word_range r) {
  const uint64_t t = global_thread();
  uint4* body = reinterpret_cast<uint4*>(r.words + r.head);
  const uint4 p = make_uint4(kPoisonWord, kPoisonWord, kPoisonWord, kPoisonWord);
  for (uint64_t v = t; v < r.vecs; v += grid_threads())
    body[v] = p;
  if (t < r.head) r.words[t] = kPoisonWord;
  const uint64_t tail = r.tail_start() + t;
  if (tail < r.count) r.words[tail] = kPoisonWord;
}

__device__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin_kernel(uint64_t nanoseconds) {
  const uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < nanoseconds) {
  }
}

/// Blocks for a range: enough to fill the device (resident blocks per SM × SMs), no more than
/// the work needs (at least one, for the scalar head and tail).
unsigned blocks_for(const word_range& r, const void* kernel) {
  int device = 0;
  int sms = 0;
  int per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess) {
    cudaGetLastError();
    sms = 1;
    per_sm = 1;
  }
  const uint64_t needed = (r.vecs + kThreads - 1) / kThreads;
  const uint64_t resident = static_cast<uint64_t>(sms) * static_cast<uint64_t>(per_sm);
  uint64_t blocks = needed < resident ? needed : resident;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

}  // namespace

cudaError_t fill_async(void* p, size_t bytes, uint64_t tag, uint64_t first_word, cudaStream_t s) {
  if (!word_aligned(p)) return cudaErrorInvalidValue;
  const word_range r = word_range::of(p, bytes, first_word);
  if (r.count == 0) return cudaSuccess;
  fill_kernel<<<blocks_for(r, reinterpret_cast<const void*>(&fill_kernel)), kThreads, 0, s>>>(
      r, tag_word(tag));
  return cudaGetLastError();
}

cudaError_t verify_async(const void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                         verify_counters* counters, cudaStream_t s) {
  if (!word_aligned(p)) return cudaErrorInvalidValue;
  const word_range r = word_range::of(p, bytes, first_word);
  if (r.count == 0) return cudaSuccess;
  verify_kernel<<<blocks_for(r, reinterpret_cast<const void*>(&verify_kernel)), kThreads, 0, s>>>(
      r, tag_word(tag), counters);
  return cudaGetLastError();
}

cudaError_t poison_async(void* p, size_t bytes, cudaStream_t s) {
  if (!word_aligned(p)) return cudaErrorInvalidValue;
  const word_range r = word_range::of(p, bytes, 0);
  if (r.count == 0) return cudaSuccess;
  poison_kernel<<<blocks_for(r, reinterpret_cast<const void*>(&poison_kernel)), kThreads, 0, s>>>(
      r);
  return cudaGetLastError();
}

cudaError_t spin_async(uint64_t nanoseconds, cudaStream_t s) {
  spin_kernel<<<1, 1, 0, s>>>(nanoseconds);
  return cudaGetLastError();
}

}  // namespace arcpool::kernels
