// Thrust and CUB take their temporaries from arcpool on the stream they run on: a Thrust sort
// through thrust::cuda::par_nosync(arcpool::thrust_allocator).on(stream), and CUB radix sort
// with its temporary storage allocated from arcpool. GPU only (skips without one).
#include <gtest/gtest.h>
#include <thrust/execution_policy.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <cub/device/device_radix_sort.cuh>

#include <vector>

#include "arcpool/resource.hpp"
#include "support/driver_test.hpp"

namespace arcpool::test {
namespace {

constexpr int kCount = 1 << 20;

struct cuda_allocator {
  arcpool_allocator_t* alloc = nullptr;
  arcpool_stream_t stream = nullptr;
  cuda_allocator() {
    arcpool_allocator_options_t o;
    arcpool_allocator_options_init(&o);
    o.driver = ARCPOOL_DRIVER_CUDA;
    EXPECT_OK(arcpool_allocator_create(&o, &alloc));
    EXPECT_OK(arcpool_stream_create(alloc, &stream));
  }
  ~cuda_allocator() {
    arcpool_stream_synchronize(alloc, stream);
    arcpool_stream_destroy(alloc, stream);
    arcpool_allocator_destroy(alloc);
  }
  arcpool_stats_t stats() {
    arcpool_stats_t s{};
    s.struct_size = sizeof(s);
    s.version = ARCPOOL_STATS_VERSION;
    EXPECT_OK(arcpool_stats_get(alloc, &s));
    return s;
  }
};

TEST(ThrustCub, ThrustSortTakesItsTemporariesFromArcpool) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  cuda_allocator a;
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(a.stream);
  void* keys = nullptr;
  ASSERT_OK(arcpool_allocator_malloc_async(a.alloc, kCount * sizeof(int), 0, a.stream, &keys));
  int* k = static_cast<int*>(keys);
  thrust_allocator temporaries(a.alloc, a.stream);
  auto policy = thrust::cuda::par_nosync(temporaries).on(s);
  thrust::sequence(policy, k, k + kCount, kCount, -1);  // descending
  const uint64_t before = a.stats().allocations;
  thrust::sort(policy, k, k + kCount);
  EXPECT_GT(a.stats().allocations, before) << "the sort's temporaries came from arcpool";
  std::vector<int> host(kCount);
  ASSERT_EQ(cudaSuccess,
            cudaMemcpyAsync(host.data(), k, kCount * sizeof(int), cudaMemcpyDeviceToHost, s));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  for (int i = 0; i < kCount; ++i)
    ASSERT_EQ(i + 1, host[i]) << "at " << i;
  EXPECT_OK(arcpool_allocator_free_async(a.alloc, keys, a.stream));
}

TEST(ThrustCub, CubRadixSortTemporaryStorageFromArcpool) {
  ARCPOOL_REQUIRE_CUDA_OR_SKIP();
  cuda_allocator a;
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(a.stream);
  std::vector<unsigned> input(kCount);
  for (int i = 0; i < kCount; ++i)
    input[i] = static_cast<unsigned>(kCount - i) * 2654435761u;
  void* in = nullptr;
  void* out = nullptr;
  ASSERT_OK(arcpool_allocator_malloc_async(a.alloc, kCount * 4, 0, a.stream, &in));
  ASSERT_OK(arcpool_allocator_malloc_async(a.alloc, kCount * 4, 0, a.stream, &out));
  ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(in, input.data(), kCount * 4, cudaMemcpyHostToDevice, s));
  size_t temp_bytes = 0;
  ASSERT_EQ(cudaSuccess,
            cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, static_cast<unsigned*>(in),
                                           static_cast<unsigned*>(out), kCount, 0, 32, s));
  void* temp = nullptr;
  ASSERT_OK(arcpool_allocator_malloc_async(a.alloc, temp_bytes, 0, a.stream, &temp));
  ASSERT_EQ(cudaSuccess,
            cub::DeviceRadixSort::SortKeys(temp, temp_bytes, static_cast<unsigned*>(in),
                                           static_cast<unsigned*>(out), kCount, 0, 32, s));
  EXPECT_OK(arcpool_allocator_free_async(a.alloc, temp, a.stream));  // after the sort, in order
  std::vector<unsigned> sorted(kCount);
  ASSERT_EQ(cudaSuccess,
            cudaMemcpyAsync(sorted.data(), out, kCount * 4, cudaMemcpyDeviceToHost, s));
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(s));
  for (int i = 1; i < kCount; ++i)
    ASSERT_LE(sorted[i - 1], sorted[i]) << "at " << i;
  EXPECT_OK(arcpool_allocator_free_async(a.alloc, in, a.stream));
  EXPECT_OK(arcpool_allocator_free_async(a.alloc, out, a.stream));
}

}  // namespace
}  // namespace arcpool::test
