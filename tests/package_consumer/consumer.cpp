// Uses the installed C++ API and the CCCL resource header.
#include <arcpool/arcpool.hpp>
#include <arcpool/resource.hpp>

#include <cstdio>

int main() {
  arcpool::allocator alloc;
  arcpool::stream s = alloc.create_stream();
  {
    arcpool::buffer b = alloc.allocate_async(4096, s);
    arcpool::memory_resource mr(alloc.get());
    void* p =
        mr.allocate_async(256, 256, cuda::stream_ref(reinterpret_cast<cudaStream_t>(s.get())));
    mr.deallocate_async(p, 256, 256, cuda::stream_ref(reinterpret_cast<cudaStream_t>(s.get())));
  }
  s.synchronize();
  std::printf("consumer ok: %s driver\n", arcpool_driver_name(alloc.driver()));
  return 0;
}
