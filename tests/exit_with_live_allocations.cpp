// design.md §10: process exit with live allocations makes no CUDA call after the runtime is torn
// down and does not crash. Buffers held in storage constructed before the allocator are
// destroyed after the allocator object and after the CUDA runtime's own teardown (which
// registers at the first CUDA call, inside the allocator's construction); a thread-local
// allocator and a by-pointer allocation stay live too; a deferred free is pending at exit.
// The test passes when the process exits 0 and prints its last line.
#include <cstdio>
#include <memory>
#include <vector>

#include "arcpool/arcpool.hpp"

namespace {

// Constructed before main, destroyed last: its buffers outlive everything else.
std::vector<arcpool::buffer> g_outliving;
thread_local std::vector<arcpool::shared_buffer> t_thread_local_buffers;

arcpool::allocator& static_allocator() {
  static arcpool::allocator a;
  return a;
}

thread_local std::unique_ptr<arcpool::allocator> t_allocator;

}  // namespace

int main() {
  arcpool::allocator& a = static_allocator();
  // Streams deliberately leaked with the process (never destroyed).
  arcpool::stream* s = new arcpool::stream(a.create_stream());
  arcpool::stream* other = new arcpool::stream(a.create_stream());

  for (int i = 0; i < 4; ++i)
    g_outliving.push_back(a.allocate_async(1 << 20, *s));

  // A deferred free pending at exit: used on another stream, freed from a third.
  arcpool::buffer pending = a.allocate_async(1 << 20, *s);
  pending.record_use(*other);
  arcpool::buffer moved = std::move(pending);
  moved.deallocate_async(*other, ARCPOOL_DEALLOCATE_FLAG_DEFERRED);

  t_allocator = std::make_unique<arcpool::allocator>();
  arcpool_stream_t raw_stream = nullptr;
  if (arcpool_stream_create(t_allocator->get(), &raw_stream) != ARCPOOL_STATUS_SUCCESS) return 1;
  t_thread_local_buffers.push_back(t_allocator->allocate_async(1 << 16, raw_stream).share());

  if (arcpool_malloc_async(1 << 20, a.device(), *s) == nullptr) {
    std::fprintf(stderr, "malloc_async failed: %s\n", arcpool_last_error());
    return 1;
  }
  std::printf("exiting with live allocations on the %s driver\n", arcpool_driver_name(a.driver()));
  return 0;
}
