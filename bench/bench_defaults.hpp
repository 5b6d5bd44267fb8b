// Shared defaults of arcpool's benchmark suites: allocators per driver, the GPU check, and the
// in-binary baselines every suite reports its ratio against.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "arcpool/arcpool.h"

namespace arcpool::bench {

/// Thread counts of the scaling suites.
#define ARCPOOL_BENCH_THREADS ThreadRange(1, 16)->UseRealTime()

/// Why the CUDA suites cannot run here ("" when they can).
std::string cuda_unavailable_reason();

/// Skips `state` with the reason when no GPU is usable. Returns true if skipped.
bool skip_without_gpu(benchmark::State& state);

/// A fresh allocator on `driver`, with the per-stream cache on or off. Aborts on failure.
arcpool_allocator_t* make_allocator(arcpool_driver_kind_t driver, bool cache = true);

/// Aborts the benchmark binary with the last error unless `status` is success: a benchmark
/// that hides a failure measures nothing.
void check(arcpool_status_t status, const char* what);

/// Nanoseconds per call of `op` over `iterations` calls (after a warm-up tenth): the in-binary
/// baseline a benchmark divides by.
template <class F>
double nanoseconds_per_op(F&& op, int iterations) {
  for (int i = 0; i < iterations / 10 + 1; ++i)
    op();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i)
    op();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  return std::chrono::duration<double, std::nano>(elapsed).count() / iterations;
}

/// Sets the counters `ns_per_op` (measured) and `ratio_vs_<baseline_name>` (measured divided
/// by the baseline's ns per op; below 1 is faster than the baseline).
void report_ratio(benchmark::State& state, double baseline_ns, const char* baseline_name,
                  double ops_per_iteration = 1);

}  // namespace arcpool::bench
