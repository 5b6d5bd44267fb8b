// The C++ quick-start example of README.md (kept identical by the readme_examples test).
#include <arcpool/arcpool.hpp>

#include <cstdio>

int main() {
  arcpool::allocator alloc;  // device 0; CUDA if usable, else host
  arcpool::stream producer = alloc.create_stream();
  arcpool::stream compute = alloc.create_stream();
  arcpool::stream copy = alloc.create_stream();

  arcpool::buffer activations = alloc.allocate_async(64 << 20, producer);
  // ... producer writes ...
  activations.transfer_to(compute);  // compute waits for the producer's work
  activations.record_use(copy);      // a copy stream reads it too

  arcpool::shared_buffer kept = std::move(activations).share();
  arcpool::shared_buffer for_logging = kept;          // a second owner (a preserve)
  std::printf("terminal: %d\n", kept.is_terminal());  // 0: two owners
  // Both go out of scope: the last owner frees it on the current stream, ordered after the
  // copy stream's use, without making any stream wait on another.
  return 0;
}
