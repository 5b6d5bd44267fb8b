// arcpool-demo: a small multi-stream pipeline. A producer stream allocates and writes; a
// consumer stream gets the buffer by transfer; a second user records its use; a shared_buffer
// outlives the producer's handle; frees route back to the origin. Prints the driver it ran on
// and the stats. Runs on the GPU when there is one, else on the host driver.
//
//   arcpool-demo [--iterations N] [--bytes N] [--json]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "arcpool/arcpool.hpp"

namespace {

struct demo_options {
  int iterations = 200;
  size_t bytes = size_t{1} << 20;
  bool json = false;
};

bool parse(int argc, char** argv, demo_options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--iterations" && i + 1 < argc) {
      o->iterations = std::atoi(argv[++i]);
    } else if (arg == "--bytes" && i + 1 < argc) {
      o->bytes = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--json") {
      o->json = true;
    } else {
      std::fprintf(stderr, "usage: %s [--iterations N] [--bytes N] [--json]\n", argv[0]);
      return false;
    }
  }
  return o->iterations > 0 && o->bytes > 0;
}

void print_stats(const arcpool_stats_t& s) {
  std::printf("%-28s %16s %16s\n", "gauge", "current", "peak");
#define ARCPOOL_DEMO_GAUGE(name, doc)                                               \
  std::printf("%-28s %16llu %16llu\n", #name, (unsigned long long)s.name##_current, \
              (unsigned long long)s.name##_peak);
  ARCPOOL_STATS_GAUGES(ARCPOOL_DEMO_GAUGE)
#undef ARCPOOL_DEMO_GAUGE
  std::printf("%-28s %16llu %16llu\n", "pool_reserved_bytes",
              (unsigned long long)s.pool_reserved_bytes_current,
              (unsigned long long)s.pool_reserved_bytes_peak);
  std::printf(
      "(peaks are approximate: each thread batches its changes, 1 MiB for byte gauges and 64 "
      "for allocations_in_use,\n before they reach the peak, so a rise smaller than one batch "
      "does not show; the count is flushed\n with the bytes, so their peaks agree; see "
      "arcpool_stats_t)\n");
  std::printf("\n%-28s %16s\n", "counter", "value");
#define ARCPOOL_DEMO_COUNTER(name, doc) \
  std::printf("%-28s %16llu\n", #name, (unsigned long long)s.name);
  ARCPOOL_STATS_COUNTERS(ARCPOOL_DEMO_COUNTER)
#undef ARCPOOL_DEMO_COUNTER
}

int run(const demo_options& o) {
  arcpool::allocator alloc;
  std::printf("arcpool-demo: driver %s, device %d, %d iterations of %zu bytes\n",
              arcpool_driver_name(alloc.driver()), alloc.device(), o.iterations, o.bytes);

  arcpool::stream producer = alloc.create_stream();
  arcpool::stream consumer = alloc.create_stream();
  arcpool::stream observer = alloc.create_stream();

  std::vector<arcpool::shared_buffer> kept;  // outlive the producer's handles
  for (int i = 0; i < o.iterations; ++i) {
    // The producer allocates: its stream is the origin.
    arcpool::buffer produced = alloc.allocate_async(o.bytes, producer);
    // The consumer takes the buffer with a fence: it waits for the producer's work.
    produced.transfer_to(consumer);
    // A second user reads it on its own stream and records that use.
    produced.record_use(observer);
    if (i % 10 == 0) {
      // Every tenth buffer is shared and kept alive beyond this iteration.
      arcpool::shared_buffer shared = std::move(produced).share();
      kept.push_back(shared);
    }
    // `produced` (or the local shared copy) goes out of scope here: the last claim frees on the
    // current stream, ordered after the observer's use, and routed back to the origin.
  }
  kept.clear();  // the kept buffers go now, long after their producer handles
  producer.synchronize();
  consumer.synchronize();
  observer.synchronize();
  alloc.trim();  // complete deferred frees so the stats below are final

  const arcpool_stats_t s = alloc.stats();
  if (o.json) {
    std::printf("%s\n", alloc.stats_json().c_str());
  } else {
    print_stats(s);
  }
  if (s.bytes_in_use_current != 0 || s.bytes_held_current != 0) {
    std::fprintf(stderr, "arcpool-demo: %llu bytes still in use, %llu held after trim\n",
                 (unsigned long long)s.bytes_in_use_current,
                 (unsigned long long)s.bytes_held_current);
    return 1;
  }
  std::printf("\narcpool-demo: ok (%s driver)\n", arcpool_driver_name(alloc.driver()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  demo_options options;
  if (!parse(argc, argv, &options)) return 2;
  try {
    return run(options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "arcpool-demo: %s\n", e.what());
    return 1;
  }
}
