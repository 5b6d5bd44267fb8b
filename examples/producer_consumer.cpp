// Plain CUDA with a producer / consumer stream pair: the producer stream fills buffers, the
// consumer stream takes each by transfer (a fence: it waits for the producer's writes), copies
// it out, and frees it; the memory goes back to the producer's lane for its next buffer.
// Needs a GPU (it calls the CUDA runtime directly); without one it says so and exits 0.
#include <cuda_runtime_api.h>
#include <arcpool/arcpool.hpp>

#include <cstdio>
#include <vector>

int main() {
  arcpool::allocator alloc;
  if (alloc.driver() != ARCPOOL_DRIVER_CUDA) {
    std::printf("producer_consumer: needs a GPU (arcpool chose the %s driver)\n",
                arcpool_driver_name(alloc.driver()));
    return 0;
  }
  arcpool::stream producer = alloc.create_stream();
  arcpool::stream consumer = alloc.create_stream();
  const size_t bytes = size_t{16} << 20;
  std::vector<unsigned char> host(bytes);
  int bad = 0;
  for (int round = 0; round < 8; ++round) {
    arcpool::buffer b = alloc.allocate_async(bytes, producer);
    cudaMemsetAsync(b.data(), round, bytes, reinterpret_cast<cudaStream_t>(producer.get()));
    b.transfer_to(consumer);  // the consumer's work below waits for the memset
    cudaMemcpyAsync(host.data(), b.data(), bytes, cudaMemcpyDeviceToHost,
                    reinterpret_cast<cudaStream_t>(consumer.get()));
    b.deallocate_async(consumer);  // after the copy; back to the producer's lane
    consumer.synchronize();
    for (unsigned char c : host)
      bad += c != static_cast<unsigned char>(round);
  }
  const arcpool_stats_t s = alloc.stats();
  std::printf("producer_consumer: %s, %llu transfers, %llu cross-stream frees\n",
              bad == 0 ? "ok" : "WRONG CONTENTS", (unsigned long long)s.transfers,
              (unsigned long long)s.cross_stream_frees);
  return bad == 0 ? 0 : 1;
}
