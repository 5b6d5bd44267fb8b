// arcpool-stress: N streams × T host threads doing random allocate / fill / transfer / use
// (record_use) / preserve / share / discard / deallocate (every routing strategy) /
// indeterminate allocations / imports / views, with a verify before every free. Any memory
// handed out while still in use shows up as a mismatch. Prints operations per second by kind,
// bytes in use and reserved and the mismatch count; exits non-zero on any mismatch or error.
// On the host driver the same program runs with host fill/verify work (CI runs it there).
// --graphs (CUDA driver) adds graph workers: each captures a step (graph allocations or a graph
// pool's blocks, fills, a fork that verifies on a second stream, a join, the frees, and an
// earlier allocation freed during the capture; a pooled step also forks to a stream arcpool was
// never given, which allocates, uses and frees a block of its own there), replays it, and
// destroys it (docs/graphs.md).
// --no-imports leaves out the imports of foreign memory, whose frees (the program's on_free) are
// ordered by the host, not by stream order: compute-sanitizer's --track-stream-ordered-races
// reported such frees as uses after free (bench/results/2026-12-04-h200).
// On a terminal a progress line (operations, rate, time left) is drawn on standard error.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "arcpool/arcpool.h"
#include "progress.hpp"
#include "workload.hpp"

namespace {

using arcpool::kernels::workload;

struct config {
  arcpool_driver_kind_t driver = ARCPOOL_DRIVER_AUTO;
  int streams = 8;
  int threads = 4;
  double seconds = 5;
  uint64_t ops = 0;  // per thread; 0: run for `seconds`
  size_t min_bytes = 256;
  size_t max_bytes = 0;      // 0: 4 MiB on the CUDA driver, 64 KiB on the host driver
  uint64_t sync_every = 32;  // backpressure: a stream synchronize every N operations
  size_t live_per_thread = 48;
  uint64_t seed = 1;
  bool poison = false;
  bool no_cache = false;    // every free reaches the pool (what compute-sanitizer can see)
  bool graphs = false;      // graph workers beside the others (CUDA driver)
  bool no_imports = false;  // no imports of foreign memory (frees the host orders)
  const char* json = nullptr;
};

// The operation kinds, in one list: name and weight.
#define ARCPOOL_STRESS_OPS(X) \
  X(allocate, 20)             \
  X(transfer, 12)             \
  X(use, 12)                  \
  X(view, 6)                  \
  X(share, 5)                 \
  X(adopt, 5)                 \
  X(deallocate, 18)           \
  X(indeterminate, 4)         \
  X(import, 3)

enum op : int {
#define ARCPOOL_STRESS_ENUM(name, weight) op_##name,
  ARCPOOL_STRESS_OPS(ARCPOOL_STRESS_ENUM)
#undef ARCPOOL_STRESS_ENUM
      op_count
};
const char* const kOpNames[] = {
#define ARCPOOL_STRESS_NAME(name, weight) #name,
    ARCPOOL_STRESS_OPS(ARCPOOL_STRESS_NAME)
#undef ARCPOOL_STRESS_NAME
};
const int kOpWeights[] = {
#define ARCPOOL_STRESS_WEIGHT(name, weight) weight,
    ARCPOOL_STRESS_OPS(ARCPOOL_STRESS_WEIGHT)
#undef ARCPOOL_STRESS_WEIGHT
};

/// One allocation a thread holds a claim on.
struct slot {
  arcpool_allocation_t* handle;
  uint64_t tag;
  size_t bytes;
};

/// Claims handed between threads (each entry holds one claim and one reference).
struct exchange {
  std::mutex mutex;
  std::vector<slot> entries;
};

struct shared_state {
  const config* cfg;
  arcpool_allocator_t* alloc;
  workload* work;
  std::vector<arcpool_stream_t> streams;
  exchange swap;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> next_tag{1};
  std::atomic<uint64_t> errors{0};
  std::mutex error_mutex;
  std::vector<std::string> first_errors;
  std::atomic<uint64_t> counts[op_count] = {};
  std::atomic<uint64_t> graphs_captured{0};
  std::atomic<uint64_t> graph_launches{0};

  /// Counts a failed call (keeping the first messages); true on success.
  bool ok(arcpool_status_t status, const char* what) {
    if (status == ARCPOOL_STATUS_SUCCESS) return true;
    errors.fetch_add(1);
    std::lock_guard<std::mutex> lock(error_mutex);
    if (first_errors.size() < 8)
      first_errors.push_back(std::string(what) + ": " + arcpool_last_error());
    return false;
  }
  /// As ok(), for a CUDA runtime call.
  bool cuda_ok(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    errors.fetch_add(1);
    std::lock_guard<std::mutex> lock(error_mutex);
    if (first_errors.size() < 8)
      first_errors.push_back(std::string(what) + ": " + cudaGetErrorName(e));
    return false;
  }
};

class worker {
 public:
  worker(shared_state& s, int index) : s_(s), rng_(s.cfg->seed * 1000003 + index) {}

  void run() {
    std::vector<int> weights(std::begin(kOpWeights), std::end(kOpWeights));
    if (s_.cfg->no_imports) weights[op_import] = 0;
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    for (uint64_t n = 0; !s_.stop.load(std::memory_order_relaxed); ++n) {
      if (s_.cfg->ops != 0 && n >= s_.cfg->ops) break;
      int o = pick(rng_);
      if (live_.size() >= s_.cfg->live_per_thread) o = op_deallocate;
      if (live_.empty() && o != op_indeterminate && o != op_import && o != op_adopt) {
        o = op_allocate;
      }
      if (do_op(o)) s_.counts[o].fetch_add(1, std::memory_order_relaxed);
      // Keep the queues short: the host enqueues far faster than the streams run.
      if (s_.cfg->sync_every != 0 && n % s_.cfg->sync_every == 0) {
        ok(arcpool_stream_synchronize(s_.alloc, stream()), "synchronize");
      }
    }
    while (!live_.empty())
      free_slot(take(live_.size() - 1));
    for (slot& a : adopted_)
      drop_adopted(a);
    adopted_.clear();
  }

 private:
  bool do_op(int o) {
    switch (o) {
      case op_allocate:
        return allocate(0);
      case op_indeterminate:
        return allocate(ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME);
      case op_import:
        return import();
      case op_transfer: {
        slot& a = any();
        return ok(arcpool_transfer(a.handle, stream()), "transfer");
      }
      case op_use:
        return use(any(), stream());
      case op_view:
        return view(any());
      case op_share:
        return share(any());
      case op_adopt:
        return adopt();
      case op_deallocate:
        if (!adopted_.empty() && coin()) {
          drop_adopted(adopted_.back());
          adopted_.pop_back();
          return true;
        }
        free_slot(take(index()));
        return true;
    }
    return false;
  }

  size_t random_size() {
    const double lo = std::log2(static_cast<double>(s_.cfg->min_bytes));
    const double hi = std::log2(static_cast<double>(s_.cfg->max_bytes));
    const double e = std::uniform_real_distribution<double>(lo, hi)(rng_);
    return std::max<size_t>(16, static_cast<size_t>(std::exp2(e)) / 16 * 16);
  }

  bool allocate(uint32_t flags) {
    slot a{nullptr, s_.next_tag.fetch_add(1), random_size()};
    arcpool_stream_t s = stream();
    if (!ok(arcpool_allocate_async(s_.alloc, a.bytes, 0, s, flags, &a.handle), "allocate")) {
      return false;
    }
    ok(s_.work->fill(data(a), a.bytes, a.tag, 0, s), "fill");
    live_.push_back(a);
    return true;
  }

  bool import() {
    slot a{nullptr, s_.next_tag.fetch_add(1), random_size()};
    void* p = s_.work->foreign_allocate(a.bytes);
    if (p == nullptr) return ok(ARCPOOL_STATUS_OUT_OF_MEMORY, "foreign allocate");
    arcpool_stream_t s = stream();
    // A consuming import: arcpool now frees the foreign memory through on_free, exactly once.
    if (!ok(arcpool_import(s_.alloc, p, a.bytes, s, ARCPOOL_IMPORT_FLAG_CONSUME,
                           &workload::foreign_free, s_.work, &a.handle),
            "import")) {
      return false;
    }
    ok(s_.work->fill(p, a.bytes, a.tag, 0, s), "fill");
    live_.push_back(a);
    return true;
  }

  /// Uses `a` on `u`: `u` waits for the current stream (the application's sync), verifies, and
  /// the use is recorded so that any free waits for it.
  bool use(const slot& a, arcpool_stream_t u) {
    arcpool_allocation_info_t info{};
    info.struct_size = sizeof(info);
    info.version = ARCPOOL_ALLOCATION_INFO_VERSION;
    if (!ok(arcpool_allocation_info(a.handle, &info), "info")) return false;
    ok(s_.work->wait_stream(u, info.current_stream), "wait_stream");
    ok(s_.work->verify(data(a), a.bytes, a.tag, 0, u), "verify");
    return ok(arcpool_record_use(a.handle, u), "record_use");
  }

  bool view(const slot& a) {
    const size_t words = a.bytes / 4;
    const size_t first = std::uniform_int_distribution<size_t>(0, words - 1)(rng_);
    const size_t count = std::uniform_int_distribution<size_t>(1, words - first)(rng_);
    arcpool_allocation_t* v = nullptr;
    if (!ok(arcpool_allocation_view(a.handle, first * 4, count * 4, &v), "view")) return false;
    arcpool_allocation_info_t info{};
    info.struct_size = sizeof(info);
    info.version = ARCPOOL_ALLOCATION_INFO_VERSION;
    ok(arcpool_allocation_info(v, &info), "info");
    void* p = nullptr;
    ok(arcpool_allocation_data(v, &p), "view data");
    ok(s_.work->verify(p, count * 4, a.tag, first, info.current_stream), "verify view");
    return ok(arcpool_allocation_release(v), "release view");
  }

  bool share(const slot& a) {
    if (!ok(arcpool_allocation_preserve(a.handle), "preserve")) return false;
    ok(arcpool_allocation_retain(a.handle), "retain");
    std::lock_guard<std::mutex> lock(s_.swap.mutex);
    s_.swap.entries.push_back(a);
    return true;
  }

  bool adopt() {
    slot a{};
    {
      std::lock_guard<std::mutex> lock(s_.swap.mutex);
      if (s_.swap.entries.empty()) return false;
      a = s_.swap.entries.back();
      s_.swap.entries.pop_back();
    }
    adopted_.push_back(a);
    return use(a, stream());
  }

  /// Gives up an adopted claim: a last use on this thread's stream, then discard; the last
  /// owner deallocates on the current stream.
  void drop_adopted(const slot& a) {
    use(a, stream());
    ok(arcpool_allocation_discard_and_release(a.handle), "discard_and_release");
  }

  /// Verifies, then deallocates with a random strategy from a random stream; with other owners
  /// outstanding the claim is discarded instead (the last owner frees).
  void free_slot(slot a) {
    arcpool_allocation_info_t info{};
    info.struct_size = sizeof(info);
    info.version = ARCPOOL_ALLOCATION_INFO_VERSION;
    ok(arcpool_allocation_info(a.handle, &info), "info");
    ok(s_.work->verify(data(a), a.bytes, a.tag, 0, info.current_stream), "verify before free");
    static constexpr uint32_t kRoutes[] = {0, ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE,
                                           ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN,
                                           ARCPOOL_DEALLOCATE_FLAG_DEFERRED};
    const uint32_t route = kRoutes[rng_() % 4];
    const arcpool_status_t status = arcpool_deallocate_async(a.handle, stream(), route);
    if (status == ARCPOOL_STATUS_NOT_OWNER) {
      ok(arcpool_allocation_discard_and_release(a.handle), "discard_and_release");
      return;
    }
    ok(status, "deallocate");
    ok(arcpool_allocation_release(a.handle), "release");
  }

  void* data(const slot& a) {
    void* p = nullptr;
    ok(arcpool_allocation_data(a.handle, &p), "data");
    return p;
  }

  bool ok(arcpool_status_t status, const char* what) { return s_.ok(status, what); }

  arcpool_stream_t stream() { return s_.streams[rng_() % s_.streams.size()]; }
  size_t index() { return rng_() % live_.size(); }
  slot& any() { return live_[index()]; }
  bool coin() { return rng_() & 1; }
  slot take(size_t i) {
    slot a = live_[i];
    live_[i] = live_.back();
    live_.pop_back();
    return a;
  }

  shared_state& s_;
  std::mt19937_64 rng_;
  std::vector<slot> live_;
  std::vector<slot> adopted_;
};

/// --graphs: captures a step on its own stream, replays it a few times, destroys it; again.
class graph_worker {
 public:
  graph_worker(shared_state& s, int index) : s_(s), rng_(s.cfg->seed * 7919 + index) {}

  void run() {
    // A stream arcpool is never told of: a pooled step's capture forks to it too (docs/graphs.md,
    // "Streams a capture forks to").
    cudaStream_t unknown = nullptr;
    if (!s_.cuda_ok(cudaStreamCreateWithFlags(&unknown, cudaStreamNonBlocking),
                    "cudaStreamCreateWithFlags")) {
      return;
    }
    arcpool_stream_t main = nullptr, side = nullptr;
    if (!s_.ok(arcpool_stream_create(s_.alloc, &main), "graph stream") ||
        !s_.ok(arcpool_stream_create(s_.alloc, &side), "graph stream")) {
      cudaStreamDestroy(unknown);
      return;
    }
    cudaEvent_t fork = nullptr, join = nullptr, join_unknown = nullptr;
    s_.cuda_ok(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "cudaEventCreate");
    s_.cuda_ok(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "cudaEventCreate");
    s_.cuda_ok(cudaEventCreateWithFlags(&join_unknown, cudaEventDisableTiming), "cudaEventCreate");
    for (uint64_t step = 0; !s_.stop.load(std::memory_order_relaxed); ++step) {
      if (s_.cfg->ops != 0 && step >= s_.cfg->ops / 16) break;
      const bool pooled = step % 2 == 1;
      const forked_stream fork_to{pooled ? unknown : nullptr, join_unknown};
      if (!one_step(main, side, fork, join, fork_to, pooled)) break;
    }
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaEventDestroy(join_unknown);
    s_.ok(arcpool_stream_synchronize(s_.alloc, main), "synchronize");
    s_.ok(arcpool_stream_destroy(s_.alloc, main), "graph stream destroy");
    s_.ok(arcpool_stream_destroy(s_.alloc, side), "graph stream destroy");
    s_.cuda_ok(cudaStreamSynchronize(unknown), "cudaStreamSynchronize");
    s_.cuda_ok(cudaStreamDestroy(unknown), "cudaStreamDestroy");
  }

 private:
  /// A stream arcpool was not given that a step's capture forks to (none: `stream` null), with
  /// the event that joins it back.
  struct forked_stream {
    cudaStream_t stream;
    cudaEvent_t join;
  };

  struct block {
    arcpool_allocation_t* handle;
    void* data;
    size_t bytes;
    uint64_t tag;
  };

  /// Allocates on `s` and fills (captured when `s` captures).
  bool make(arcpool_stream_t s, block* out) {
    const size_t words = 4 + rng_() % 4096;
    *out = block{nullptr, nullptr, words * 4, s_.next_tag.fetch_add(1)};
    if (!s_.ok(arcpool_allocate_async(s_.alloc, out->bytes, 0, s, 0, &out->handle), "allocate")) {
      return false;
    }
    s_.ok(arcpool_allocation_data(out->handle, &out->data), "data");
    return s_.ok(s_.work->fill(out->data, out->bytes, out->tag, 0, s), "fill");
  }

  bool free_block(const block& b, arcpool_stream_t s) {
    s_.ok(arcpool_deallocate_async(b.handle, s, 0), "deallocate");
    return s_.ok(arcpool_allocation_release(b.handle), "release");
  }

  bool one_step(arcpool_stream_t main, arcpool_stream_t side, cudaEvent_t fork, cudaEvent_t join,
                const forked_stream& unknown, bool pooled) {
    const auto cu = [](arcpool_stream_t x) { return reinterpret_cast<cudaStream_t>(x); };
    block earlier{};  // allocated before the capture, freed during it
    if (!make(main, &earlier)) return false;
    arcpool_graph_pool_t* pool = nullptr;
    if (pooled && !s_.ok(arcpool_graph_pool_create(s_.alloc, &pool), "graph pool")) return false;
    if (!s_.cuda_ok(cudaStreamBeginCapture(cu(main), cudaStreamCaptureModeThreadLocal),
                    "cudaStreamBeginCapture")) {
      return false;
    }
    if (pool != nullptr) s_.ok(arcpool_graph_pool_begin(pool, main), "graph pool begin");
    s_.ok(s_.work->verify(earlier.data, earlier.bytes, earlier.tag, 0, main), "verify");
    free_block(earlier, main);
    std::vector<block> made(1 + rng_() % 4);
    for (block& b : made)
      make(main, &b);
    s_.cuda_ok(cudaEventRecord(fork, cu(main)), "cudaEventRecord");
    s_.cuda_ok(cudaStreamWaitEvent(cu(side), fork, 0), "cudaStreamWaitEvent");
    for (const block& b : made)
      s_.ok(s_.work->verify(b.data, b.bytes, b.tag, 0, side), "verify");
    s_.cuda_ok(cudaEventRecord(join, cu(side)), "cudaEventRecord");
    s_.cuda_ok(cudaStreamWaitEvent(cu(main), join, 0), "cudaStreamWaitEvent");
    if (unknown.stream != nullptr) {
      // Its own block from the graph pool, used and freed there, then joined back.
      const auto u = reinterpret_cast<arcpool_stream_t>(unknown.stream);
      s_.cuda_ok(cudaStreamWaitEvent(unknown.stream, fork, 0), "cudaStreamWaitEvent");
      block own{};
      if (make(u, &own)) {
        s_.ok(s_.work->verify(own.data, own.bytes, own.tag, 0, u), "verify");
        free_block(own, u);
      }
      s_.cuda_ok(cudaEventRecord(unknown.join, unknown.stream), "cudaEventRecord");
      s_.cuda_ok(cudaStreamWaitEvent(cu(main), unknown.join, 0), "cudaStreamWaitEvent");
    }
    for (const block& b : made)
      s_.ok(s_.work->verify(b.data, b.bytes, b.tag, 0, main), "verify before free");
    for (const block& b : made)
      free_block(b, main);
    cudaGraph_t graph = nullptr;
    const bool captured =
        s_.cuda_ok(cudaStreamEndCapture(cu(main), &graph), "cudaStreamEndCapture");
    if (pool != nullptr) {
      s_.ok(arcpool_graph_pool_end(pool, main), "graph pool end");
      s_.ok(arcpool_graph_pool_release(pool), "graph pool release");
    }
    if (!captured) return false;
    s_.graphs_captured.fetch_add(1, std::memory_order_relaxed);
    cudaGraphExec_t exec = nullptr;
    if (s_.cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate")) {
      const int launches = 1 + static_cast<int>(rng_() % 8);
      for (int i = 0; i < launches; ++i) {
        if (s_.cuda_ok(cudaGraphLaunch(exec, cu(main)), "cudaGraphLaunch")) {
          s_.graph_launches.fetch_add(1, std::memory_order_relaxed);
        }
        if (i % 2 == 1) s_.ok(arcpool_stream_synchronize(s_.alloc, main), "synchronize");
      }
      s_.cuda_ok(cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
    }
    return s_.cuda_ok(cudaGraphDestroy(graph), "cudaGraphDestroy");
  }

  shared_state& s_;
  std::mt19937_64 rng_;
};

bool parse(int argc, char** argv, config* c) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--driver") {
      const std::string d = value();
      if (d != "cuda" && d != "host" && d != "auto") {
        std::fprintf(stderr, "arcpool-stress: --driver %s is none of auto, cuda, host\n",
                     d.c_str());
        return false;
      }
      c->driver = d == "cuda"   ? ARCPOOL_DRIVER_CUDA
                  : d == "host" ? ARCPOOL_DRIVER_HOST
                                : ARCPOOL_DRIVER_AUTO;
    } else if (a == "--streams") {
      c->streams = std::atoi(value());
    } else if (a == "--threads") {
      c->threads = std::atoi(value());
    } else if (a == "--seconds") {
      c->seconds = std::atof(value());
    } else if (a == "--ops") {
      c->ops = std::strtoull(value(), nullptr, 10);
    } else if (a == "--min-bytes") {
      c->min_bytes = std::strtoull(value(), nullptr, 10);
    } else if (a == "--max-bytes") {
      c->max_bytes = std::strtoull(value(), nullptr, 10);
    } else if (a == "--sync-every") {
      c->sync_every = std::strtoull(value(), nullptr, 10);
    } else if (a == "--live") {
      c->live_per_thread = std::strtoull(value(), nullptr, 10);
    } else if (a == "--seed") {
      c->seed = std::strtoull(value(), nullptr, 10);
    } else if (a == "--poison") {
      c->poison = true;
    } else if (a == "--no-cache") {
      c->no_cache = true;
    } else if (a == "--graphs") {
      c->graphs = true;
    } else if (a == "--no-imports") {
      c->no_imports = true;
    } else if (a == "--json") {
      c->json = value();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--driver auto|cuda|host] [--streams N] [--threads N] "
                   "[--seconds S | --ops N] [--min-bytes N] [--max-bytes N] [--live N] "
                   "[--sync-every N] [--seed N] [--poison] [--no-cache] [--graphs] "
                   "[--no-imports] [--json FILE]\n",
                   argv[0]);
      return false;
    }
  }
  return c->streams > 0 && c->threads > 0 && c->min_bytes >= 16 &&
         (c->max_bytes == 0 || c->max_bytes >= c->min_bytes) && c->live_per_thread > 0;
}

/// Until the workers are done: stops them when a timed run's seconds are up, and draws the
/// progress line (operations so far) on a terminal.
void watch(shared_state& s, const config& cfg, std::chrono::steady_clock::time_point start,
           const std::atomic<int>& running) {
  arcpool::tools::progress line("arcpool-stress", "operations");
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(cfg.seconds));
  const double planned = static_cast<double>(cfg.ops) * cfg.threads;
  while (running.load() > 0) {
    const auto now = std::chrono::steady_clock::now();
    if (cfg.ops == 0 && now >= deadline) {
      s.stop = true;
      break;
    }
    const auto nap = std::chrono::steady_clock::duration(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(cfg.ops == 0 ? std::min(nap, deadline - now) : nap);
    uint64_t done = 0;
    for (const auto& c : s.counts)
      done += c.load(std::memory_order_relaxed);
    const double elapsed = std::chrono::duration<double>(now - start).count();
    line.update(done, cfg.ops == 0 ? elapsed / cfg.seconds : done / planned);
  }
}

}  // namespace

int main(int argc, char** argv) {
  config cfg;
  if (!parse(argc, argv, &cfg)) return 2;

  // The allocator comes first (it picks the driver); the poison hook needs the workload, which
  // needs the allocator on the host driver: resolve the driver with a probe allocator.
  arcpool_allocator_options_t options;
  arcpool_allocator_options_init(&options);
  options.driver = cfg.driver;
  arcpool_allocator_t* probe = nullptr;
  if (arcpool_allocator_create(&options, &probe) != ARCPOOL_STATUS_SUCCESS) {
    std::fprintf(stderr, "arcpool-stress: %s\n", arcpool_last_error());
    return 1;
  }
  options.driver = arcpool_allocator_driver(probe);
  if (cfg.max_bytes == 0) {
    cfg.max_bytes = options.driver == ARCPOOL_DRIVER_HOST ? size_t{64} << 10 : size_t{4} << 20;
    cfg.max_bytes = std::max(cfg.max_bytes, cfg.min_bytes);
  }
  std::unique_ptr<workload> work = arcpool::kernels::make_workload(probe);
  if (!work) {
    std::fprintf(stderr, "arcpool-stress: no %s workload in this build (kernels off)\n",
                 arcpool_driver_name(options.driver));
    arcpool_allocator_destroy(probe);
    return 1;
  }
  arcpool_allocator_t* alloc = probe;
  if (cfg.poison || cfg.no_cache) {
    // Poison mode: every free is preceded by a poison fill on the freeing stream.
    if (cfg.poison) {
      options.before_free = &workload::poison_before_free;
      options.before_free_user_data = work.get();
    }
    if (cfg.no_cache) options.stream_cache_bytes = 0;
    if (arcpool_allocator_create(&options, &alloc) != ARCPOOL_STATUS_SUCCESS) {
      std::fprintf(stderr, "arcpool-stress: %s\n", arcpool_last_error());
      return 1;
    }
  }

  shared_state s;
  s.cfg = &cfg;
  s.alloc = alloc;
  s.work = work.get();
  for (int i = 0; i < cfg.streams; ++i) {
    arcpool_stream_t st = nullptr;
    if (arcpool_stream_create(alloc, &st) != ARCPOOL_STATUS_SUCCESS) {
      std::fprintf(stderr, "arcpool-stress: %s\n", arcpool_last_error());
      return 1;
    }
    s.streams.push_back(st);
  }
  if (cfg.graphs && options.driver != ARCPOOL_DRIVER_CUDA) {
    std::fprintf(stderr,
                 "arcpool-stress: --graphs needs the CUDA driver (the %s driver builds "
                 "no graphs)\n",
                 arcpool_driver_name(options.driver));
    return 2;
  }
  const int graph_threads = cfg.graphs ? std::max(1, cfg.threads / 2) : 0;
  std::printf(
      "arcpool-stress: %s driver, %d streams x %d threads, %s, sizes %zu..%zu bytes%s%s%s\n",
      arcpool_driver_name(options.driver), cfg.streams, cfg.threads,
      cfg.ops ? (std::to_string(cfg.ops) + " ops per thread").c_str()
              : (std::to_string(cfg.seconds) + " s").c_str(),
      cfg.min_bytes, cfg.max_bytes, cfg.poison ? ", poison on free" : "",
      cfg.no_cache ? ", cache off" : "",
      cfg.graphs ? (", " + std::to_string(graph_threads) + " graph workers").c_str() : "");

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  std::atomic<int> running{cfg.threads + graph_threads};
  for (int t = 0; t < cfg.threads; ++t) {
    threads.emplace_back([&s, &running, t] {
      worker(s, t).run();
      running.fetch_sub(1);
    });
  }
  for (int t = 0; t < graph_threads; ++t) {
    threads.emplace_back([&s, &running, t] {
      graph_worker(s, t).run();
      running.fetch_sub(1);
    });
  }
  watch(s, cfg, start, running);
  for (auto& th : threads)
    th.join();
  // Claims still in the exchange: nobody adopted them.
  for (slot& a : s.swap.entries)
    arcpool_allocation_discard_and_release(a.handle);
  for (arcpool_stream_t st : s.streams)
    arcpool_stream_synchronize(alloc, st);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  arcpool_stats_get(alloc, &st);  // before trim: the reserved peak as the run left it
  if (arcpool_allocator_trim(alloc, 0) != ARCPOOL_STATUS_SUCCESS) {
    s.errors.fetch_add(1);
    s.first_errors.push_back(std::string("trim: ") + arcpool_last_error());
  }
  for (arcpool_stream_t stream : s.streams)
    arcpool_stream_synchronize(alloc, stream);
  arcpool_stats_t after{};
  after.struct_size = sizeof(after);
  after.version = ARCPOOL_STATS_VERSION;
  arcpool_stats_get(alloc, &after);
  // Frees deferred to a graph's end reach the reclaim worker from CUDA's user-object thread,
  // asynchronously after the graph went: give them a moment, then trim again.
  for (int i = 0; i < 500 && cfg.graphs && after.bytes_held_current != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    arcpool_allocator_trim(alloc, 0);
    arcpool_stats_get(alloc, &after);
  }
  const uint64_t mismatches = work->mismatches();
  const uint64_t words = work->verified_words();

  uint64_t total = 0;
  std::printf("\n%-16s %12s %14s\n", "operation", "count", "per second");
  for (int o = 0; o < op_count; ++o) {
    const uint64_t n = s.counts[o].load();
    total += n;
    std::printf("%-16s %12" PRIu64 " %14.0f\n", kOpNames[o], n, n / elapsed);
  }
  std::printf("%-16s %12" PRIu64 " %14.0f\n", "all", total, total / elapsed);
  std::printf("\nbytes in use: peak %" PRIu64 ", at end %" PRIu64 "\n", st.bytes_in_use_peak,
              after.bytes_in_use_current);
  std::printf("pool reserved: peak %" PRIu64 " bytes\n", st.pool_reserved_bytes_peak);
  std::printf("frees %" PRIu64 " (same-stream %" PRIu64 ", cross-stream %" PRIu64
              ", deferred %" PRIu64 ", origin-routed %" PRIu64 ", fallbacks %" PRIu64
              "), implicit %" PRIu64 ", ignored %" PRIu64 ", cache hits %" PRIu64 "\n",
              after.frees, after.same_stream_frees, after.cross_stream_frees, after.deferred_frees,
              after.origin_routed_frees, after.origin_fallbacks, after.implicit_frees,
              after.ignored_deallocations, after.cache_hits);
  if (cfg.graphs) {
    std::printf("graphs captured %" PRIu64 ", launches %" PRIu64 ", graph allocations %" PRIu64
                ", graph frees %" PRIu64 ", deferred to a graph's end %" PRIu64 "\n",
                s.graphs_captured.load(), s.graph_launches.load(), after.graph_allocations,
                after.graph_frees, after.graph_deferred_frees);
  }
  std::printf("verified words: %" PRIu64 "\nmismatches: %" PRIu64 "\nerrors: %" PRIu64 "\n", words,
              mismatches, s.errors.load());
  for (const std::string& e : s.first_errors)
    std::printf("  error: %s\n", e.c_str());

  const bool leaked = after.bytes_in_use_current != 0 || after.bytes_held_current != 0;
  if (leaked) {
    std::printf("leak: %" PRIu64 " bytes in use, %" PRIu64 " held after the run\n",
                after.bytes_in_use_current, after.bytes_held_current);
  }
  bool unwritten = false;
  if (cfg.json != nullptr) {
    FILE* f = std::fopen(cfg.json, "w");
    if (f == nullptr) {
      std::fprintf(stderr, "arcpool-stress: cannot write %s: %s\n", cfg.json, std::strerror(errno));
      unwritten = true;
    } else {
      std::fprintf(f,
                   "{\"driver\": \"%s\", \"streams\": %d, \"threads\": %d, \"seconds\": %.3f, "
                   "\"operations\": %" PRIu64
                   ", \"operations_per_second\": %.0f, "
                   "\"verified_words\": %" PRIu64 ", \"mismatches\": %" PRIu64
                   ", \"errors\": %" PRIu64 ", \"poison\": %s, \"bytes_in_use_peak\": %" PRIu64
                   ", \"pool_reserved_peak\": %" PRIu64 "}\n",
                   arcpool_driver_name(options.driver), cfg.streams, cfg.threads, elapsed, total,
                   total / elapsed, words, mismatches, s.errors.load(),
                   cfg.poison ? "true" : "false", st.bytes_in_use_peak,
                   st.pool_reserved_bytes_peak);
      std::fclose(f);
    }
  }
  for (arcpool_stream_t stream : s.streams)
    arcpool_stream_destroy(alloc, stream);
  if (alloc != probe) arcpool_allocator_destroy(alloc);
  work.reset();
  arcpool_allocator_destroy(probe);
  const bool failed = mismatches != 0 || s.errors.load() != 0 || leaked || unwritten;
  std::printf("\narcpool-stress: %s\n", failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
