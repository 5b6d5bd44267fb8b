// The operations whose instruction counts gate CI (tools/instruction-budget, design.md §13).
// Calls only the public C API of the shared libarcpool.so, with default options (cache on,
// stats on, NVTX compiled in, log off) on the null driver, so that the count is arcpool's own
// bookkeeping. Each run first warms the operation up (the cache holds a block, the streams are
// known, the event pool is filled), then repeats it N times; the script runs N and 2N under
// callgrind and divides the difference by N, which cancels everything but the loop.
//
// usage: arcpool_instruction_counts ROW ITERATIONS [THREADS]
//   ROW: pair | by_pointer | preserve_discard | transfer | record_use | legacy_pair |
//        legacy_by_pointer | framework
//   THREADS: each thread runs the row on its own created stream (default 1); the legacy_ rows
//   run pair and by_pointer on the legacy default stream (NULL), which PyTorch's and CuPy's
//   default streams are, shared by every thread; framework runs the calls PyTorch's and CuPy's
//   hooks make (arcpool_malloc_async, arcpool_free_async: device 0's default allocator, which
//   is the allocator under test) on the legacy default stream.
#include <arcpool/arcpool.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBytes = 4096;

/// Exits with the status's message when a call failed: a count of a failing path means nothing.
void check(arcpool_status_t status, const char* what) {
  if (status != ARCPOOL_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, arcpool_status_string(status),
                 arcpool_last_error());
    std::exit(2);
  }
}

arcpool_stream_t create_stream(arcpool_allocator_t* a) {
  arcpool_stream_t s = nullptr;
  check(arcpool_stream_create(a, &s), "arcpool_stream_create");
  return s;
}

/// allocate + deallocate on the same stream + release: the fast path's cache hit.
void pair(arcpool_allocator_t* a, arcpool_stream_t s, long n) {
  for (long i = 0; i < n; ++i) {
    arcpool_allocation_t* x = nullptr;
    check(arcpool_allocate_async(a, kBytes, 0, s, 0, &x), "arcpool_allocate_async");
    check(arcpool_deallocate_async(x, s, 0), "arcpool_deallocate_async");
    check(arcpool_allocation_release(x), "arcpool_allocation_release");
  }
}

/// The by-pointer pair frameworks take.
void by_pointer(arcpool_allocator_t* a, arcpool_stream_t s, long n) {
  for (long i = 0; i < n; ++i) {
    void* p = nullptr;
    check(arcpool_allocator_malloc_async(a, kBytes, 0, s, &p), "arcpool_allocator_malloc_async");
    check(arcpool_allocator_free_async(a, p, s), "arcpool_allocator_free_async");
  }
}

/// The framework hooks' pair: malloc and free through device 0's default allocator.
void framework(long n) {
  for (long i = 0; i < n; ++i) {
    void* p = arcpool_malloc_async(kBytes, 0, nullptr);
    if (p == nullptr) check(ARCPOOL_STATUS_OUT_OF_MEMORY, "arcpool_malloc_async");
    check(arcpool_free_async(p, kBytes, 0, nullptr), "arcpool_free_async");
  }
}

/// Everything that runs before and after the loop of an allocation-bound row.
template <typename Body>
void with_allocation(arcpool_allocator_t* a, arcpool_stream_t s, Body body) {
  arcpool_allocation_t* x = nullptr;
  check(arcpool_allocate_async(a, kBytes, 0, s, 0, &x), "arcpool_allocate_async");
  body(x);
  check(arcpool_deallocate_async(x, s, 0), "arcpool_deallocate_async");
  check(arcpool_allocation_release(x), "arcpool_allocation_release");
}

void preserve_discard(arcpool_allocator_t* a, arcpool_stream_t s, long n) {
  with_allocation(a, s, [&](arcpool_allocation_t* x) {
    for (long i = 0; i < n; ++i) {
      check(arcpool_allocation_preserve(x), "arcpool_allocation_preserve");
      int last = 0;
      check(arcpool_allocation_discard(x, &last), "arcpool_allocation_discard");
    }
  });
}

/// One transfer per iteration, alternating between two streams.
void transfer(arcpool_allocator_t* a, arcpool_stream_t s, arcpool_stream_t other, long n) {
  with_allocation(a, s, [&](arcpool_allocation_t* x) {
    for (long i = 0; i < n; ++i) {
      check(arcpool_transfer(x, (i & 1) == 0 ? other : s), "arcpool_transfer");
    }
    if ((n & 1) != 0) check(arcpool_transfer(x, s), "arcpool_transfer");
  });
}

void record_use(arcpool_allocator_t* a, arcpool_stream_t s, arcpool_stream_t other, long n) {
  with_allocation(a, s, [&](arcpool_allocation_t* x) {
    for (long i = 0; i < n; ++i)
      check(arcpool_record_use(x, other), "arcpool_record_use");
  });
}

/// Runs `row` on a fresh pair of this thread's streams: once to warm up, then `n` times.
void run_row(arcpool_allocator_t* a, const std::string& row, long n) {
  arcpool_stream_t s = create_stream(a);
  arcpool_stream_t other = create_stream(a);
  for (long count : {1L, n}) {
    if (row == "pair") {
      pair(a, s, count);
    } else if (row == "by_pointer") {
      by_pointer(a, s, count);
    } else if (row == "legacy_pair") {
      pair(a, nullptr, count);
    } else if (row == "legacy_by_pointer") {
      by_pointer(a, nullptr, count);
    } else if (row == "framework") {
      framework(count);
    } else if (row == "preserve_discard") {
      preserve_discard(a, s, count);
    } else if (row == "transfer") {
      transfer(a, s, other, count);
    } else {
      record_use(a, s, other, count);
    }
  }
  check(arcpool_stream_destroy(a, other), "arcpool_stream_destroy");
  check(arcpool_stream_destroy(a, s), "arcpool_stream_destroy");
}

}  // namespace

int main(int argc, char** argv) {
  const char* rows[] = {"pair",       "by_pointer",  "preserve_discard",  "transfer",
                        "record_use", "legacy_pair", "legacy_by_pointer", "framework"};
  bool known = false;
  for (const char* r : rows)
    known = known || (argc >= 3 && std::strcmp(argv[1], r) == 0);
  const long n = argc >= 3 ? std::strtol(argv[2], nullptr, 10) : 0;
  const long threads = argc >= 4 ? std::strtol(argv[3], nullptr, 10) : 1;
  if (!known || n <= 0 || threads <= 0 || argc > 4) {
    std::fprintf(stderr,
                 "usage: %s pair|by_pointer|preserve_discard|transfer|record_use|legacy_pair|"
                 "legacy_by_pointer|framework ITERATIONS [THREADS]\n",
                 argv[0]);
    return 1;
  }
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = ARCPOOL_DRIVER_NULL;
  arcpool_allocator_t* a = nullptr;
  check(arcpool_allocator_create(&options, &a), "arcpool_allocator_create");
  check(arcpool_default_allocator_set(0, a), "arcpool_default_allocator_set");
  const std::string row = argv[1];
  std::vector<std::thread> workers;
  for (long t = 0; t < threads; ++t)
    workers.emplace_back([&] { run_row(a, row, n); });
  for (std::thread& w : workers)
    w.join();
  check(arcpool_default_allocator_set(0, nullptr), "arcpool_default_allocator_set");
  arcpool_allocator_destroy(a);
  return 0;
}
