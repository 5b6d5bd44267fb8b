// Thrust and CUB with their temporaries from arcpool, stream-ordered on one stream. Needs a GPU;
// without one it says so and exits 0.
#include <thrust/execution_policy.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <arcpool/resource.hpp>
#include <cub/device/device_reduce.cuh>

#include <cstdio>

int main() {
  arcpool::allocator alloc;
  if (alloc.driver() != ARCPOOL_DRIVER_CUDA) {
    std::printf("thrust_cub: needs a GPU (arcpool chose the %s driver)\n",
                arcpool_driver_name(alloc.driver()));
    return 0;
  }
  arcpool::stream stream = alloc.create_stream();
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream.get());
  const int n = 1 << 20;
  arcpool::buffer data = alloc.allocate_async(n * sizeof(int), stream);
  int* d = static_cast<int*>(data.data());

  // Thrust: temporaries of the sort come from arcpool on `stream`.
  auto policy = thrust::cuda::par_nosync(arcpool::thrust_allocator(alloc.get(), stream)).on(s);
  thrust::sequence(policy, d, d + n, n, -1);
  thrust::sort(policy, d, d + n);

  // CUB: temporary storage sized, then allocated from arcpool on the same stream.
  arcpool::buffer sum = alloc.allocate_async(sizeof(long long), stream);
  size_t temp_bytes = 0;
  cub::DeviceReduce::Sum(nullptr, temp_bytes, d, static_cast<long long*>(sum.data()), n, s);
  arcpool::buffer temp = alloc.allocate_async(temp_bytes, stream);
  cub::DeviceReduce::Sum(temp.data(), temp_bytes, d, static_cast<long long*>(sum.data()), n, s);

  long long host = 0;
  cudaMemcpyAsync(&host, sum.data(), sizeof(host), cudaMemcpyDeviceToHost, s);
  stream.synchronize();
  const long long expected = static_cast<long long>(n) * (n + 1) / 2;
  std::printf("thrust_cub: sum %lld (%s), %llu allocations from arcpool\n", host,
              host == expected ? "ok" : "WRONG", (unsigned long long)alloc.stats().allocations);
  return host == expected ? 0 : 1;
}
