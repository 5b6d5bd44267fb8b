// Shared setup of the Google Benchmark suites. Uses one internal on purpose: the driver's
// device probe (drivers/driver.hpp), so that a suite can say why it skips without a GPU.
#include "bench_defaults.hpp"

#include <cstdio>
#include <cstdlib>

#include "drivers/driver.hpp"

namespace arcpool::bench {

std::string cuda_unavailable_reason() {
  static const std::string reason = [] {
    std::string why;
    return detail::cuda_device_usable(0, &why) ? std::string() : why;
  }();
  return reason;
}

bool skip_without_gpu(benchmark::State& state) {
  const std::string why = cuda_unavailable_reason();
  if (why.empty()) return false;
  state.SkipWithError(("no GPU, CUDA suite not run: " + why).c_str());
  return true;
}

void check(arcpool_status_t status, const char* what) {
  if (status == ARCPOOL_STATUS_SUCCESS) return;
  std::fprintf(stderr, "benchmark: %s failed: %s\n", what, arcpool_last_error());
  std::abort();
}

arcpool_allocator_t* make_allocator(arcpool_driver_kind_t driver, bool cache) {
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = driver;
  if (!cache) options.stream_cache_bytes = 0;
  arcpool_allocator_t* a = nullptr;
  check(arcpool_allocator_create(&options, &a), "arcpool_allocator_create");
  return a;
}

void report_ratio(benchmark::State& state, double baseline_ns, const char* baseline_name,
                  double ops_per_iteration) {
  // ratio = (time / (iterations * ops)) / baseline: an inverted per-iteration rate of
  // ops * baseline seconds.
  state.counters["baseline_ns"] = baseline_ns;
  state.counters[std::string("ratio_vs_") + baseline_name] = benchmark::Counter(
      baseline_ns * 1e-9 * ops_per_iteration,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

}  // namespace arcpool::bench
