// arcpool-replay: replays allocation logs in RMM's CSV columns (Thread,Time,Action,Pointer,Size,
// Stream; the stream as a hexadecimal handle, 0 the legacy default stream) through arcpool (cache
// on and off) and through the raw driver pool, and reports time per event, peak in use, peak
// reserved and their ratios. arcpool's own logs (arcpool_allocator_log_open) replay too.
//
//   arcpool-replay [--driver auto|cuda|host|null] [--capacity BYTES] [--json FILE]
//                  [--series FILE | --devices] TRACE...
//
// --devices: the traces are one multi-device run, one file per device (RMM logs one device per
// file): trace i replays on device i's allocator (cache on), all at once, each on a thread of
// its own, and the report gives each device's peaks.
//
// --series FILE (one trace): after every event of the arcpool replay (cache on), the bytes in
// use per trace stream and arcpool's bytes in use, held and cached, as JSON for
// `python -m arcpool plot FILE`.
//
// On the host driver the pool hands out address space with no backing memory (the traces'
// footprints reach 24 GB), under a simulated capacity (default 64 GiB). On a terminal a progress
// line (events replayed, rate, time left) is drawn on standard error. Uses one internal on
// purpose: the allocator's driver (detail::from_handle), to replay the same trace on the raw pool.
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "arcpool/arcpool.h"
#include "core/allocator.hpp"
#include "progress.hpp"

namespace {

struct event {
  double time;  // seconds since the trace's first row
  bool allocate;
  uint64_t pointer;  // the trace's pointer: a key only
  size_t size;
  uint64_t stream;  // the trace's stream handle; 0: legacy default
};

struct trace {
  std::string name;
  std::vector<event> events;
  uint64_t peak_live = 0;  // largest sum of live requested sizes: the bound any allocator meets
  size_t streams = 0;
};

/// The Time column (HH:MM:SS.ffffff, local time of day) in seconds.
double parse_time(const std::string& s) {
  int h = 0, m = 0;
  double sec = 0;
  if (std::sscanf(s.c_str(), "%d:%d:%lf", &h, &m, &sec) != 3) return 0;
  return h * 3600.0 + m * 60.0 + sec;
}

uint64_t parse_hex(const std::string& s) {
  if (s == "(nil)" || s.empty()) return 0;
  return std::strtoull(s.c_str(), nullptr, 16);
}

bool load(const char* path, trace* t) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "arcpool-replay: cannot read %s\n", path);
    return false;
  }
  t->name = path;
  if (const char* slash = std::strrchr(path, '/')) t->name = slash + 1;
  // RMM's header (logging_resource_adaptor), which arcpool's allocation log writes too. A folder
  // opens as a stream with nothing to read.
  constexpr const char* kHeader = "Thread,Time,Action,Pointer,Size,Stream";
  std::string line;
  if (!std::getline(in, line) || line.compare(0, std::strlen(kHeader), kHeader) != 0) {
    std::fprintf(stderr,
                 "arcpool-replay: %s is not an allocation log of RMM's columns: its first line "
                 "is not %s\n",
                 path, kHeader);
    return false;
  }
  std::unordered_map<uint64_t, size_t> live;
  std::unordered_map<uint64_t, bool> streams;
  uint64_t live_bytes = 0;
  size_t number = 1;
  double first = -1, day = 0, last = 0;
  while (std::getline(in, line)) {
    ++number;
    std::vector<std::string> f;
    std::stringstream row(line);
    for (std::string cell; std::getline(row, cell, ',');)
      f.push_back(cell);
    if (line.empty()) continue;
    if (f.size() < 6) {
      std::fprintf(stderr, "arcpool-replay: %s:%zu: %zu fields, not RMM's 6: %s\n", path, number,
                   f.size(), line.c_str());
      return false;
    }
    const std::string& action = f[2];
    if (action == "allocate failure") continue;  // nothing was allocated
    if (action != "allocate" && action != "free") {
      // As RMM's parser (benchmarks/utilities/log_parser.hpp: "Invalid action string.").
      std::fprintf(stderr,
                   "arcpool-replay: %s:%zu: action \"%s\" is none of allocate, allocate "
                   "failure, free\n",
                   path, number, action.c_str());
      return false;
    }
    double at = parse_time(f[1]) + day;
    if (at + 12 * 3600.0 < last) {  // past midnight
      day += 24 * 3600.0;
      at += 24 * 3600.0;
    }
    last = at;
    if (first < 0) first = at;
    event e{at - first, action == "allocate", parse_hex(f[3]),
            std::strtoull(f[4].c_str(), nullptr, 10), parse_hex(f[5])};
    streams[e.stream] = true;
    if (e.allocate) {
      if (live.count(e.pointer) != 0) {
        std::fprintf(stderr, "%s:%zu: %s allocated twice; row skipped\n", path, number,
                     f[3].c_str());
        continue;
      }
      live[e.pointer] = e.size;
      live_bytes += e.size;
      if (live_bytes > t->peak_live) t->peak_live = live_bytes;
    } else {
      auto it = live.find(e.pointer);
      if (it == live.end()) continue;  // freed before the recording started
      live_bytes -= it->second;
      live.erase(it);
    }
    t->events.push_back(e);
  }
  t->streams = streams.size();
  return true;
}

/// Events between two looks at the clock for the progress line (the replays are timed).
constexpr size_t kProgressEvery = 1024;

struct result {
  std::string mode;
  double seconds = 0;
  uint64_t peak_reserved = 0;
  uint64_t peak_in_use = 0;
  uint64_t failures = 0;
};

/// What --series writes: after every event, the bytes in use per trace stream (by the stream
/// that allocated) and arcpool's gauges.
struct series {
  std::vector<double> time;
  std::vector<uint64_t> streams;                     // the trace's stream handles, in order
  std::vector<std::vector<uint64_t>> stream_in_use;  // [stream][event]
  std::vector<uint64_t> in_use, held, cached;        // arcpool_stats_t's _current, per event
};

arcpool_allocator_t* make(arcpool_driver_kind_t driver, size_t capacity, bool cache,
                          int device = 0) {
  arcpool_allocator_options_t o;
  arcpool_allocator_options_init(&o);
  o.driver = driver;
  o.device = device;
  o.host_capacity_bytes = capacity;
  o.host_reserve_only = 1;
  if (!cache) o.stream_cache_bytes = 0;
  arcpool_allocator_t* a = nullptr;
  if (arcpool_allocator_create(&o, &a) != ARCPOOL_STATUS_SUCCESS) {
    std::fprintf(stderr, "arcpool-replay: %s\n", arcpool_last_error());
    std::exit(1);
  }
  return a;
}

/// Streams of the trace, created through arcpool (so the fast path may cache on them).
std::unordered_map<uint64_t, arcpool_stream_t> make_streams(arcpool_allocator_t* a,
                                                            const trace& t) {
  std::unordered_map<uint64_t, arcpool_stream_t> map;
  map[0] = nullptr;
  for (const event& e : t.events) {
    if (map.count(e.stream) != 0) continue;
    arcpool_stream_t s = nullptr;
    arcpool_stream_create(a, &s);
    map[e.stream] = s;
  }
  return map;
}

void settle(arcpool_allocator_t* a, const std::unordered_map<uint64_t, arcpool_stream_t>& map) {
  for (const auto& [key, s] : map)
    arcpool_stream_synchronize(a, s);
}

/// Appends the state after one event to `out`: `in_use` holds the bytes in use per stream
/// index of out->streams.
void sample(arcpool_allocator_t* a, double time, const std::vector<uint64_t>& in_use, series* out) {
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  arcpool_stats_get(a, &st);
  out->time.push_back(time);
  for (size_t i = 0; i < in_use.size(); ++i)
    out->stream_in_use[i].push_back(in_use[i]);
  out->in_use.push_back(st.bytes_in_use_current);
  out->held.push_back(st.bytes_held_current);
  out->cached.push_back(st.bytes_cached_current);
}

/// Replays `t` through arcpool, on `device`'s allocator; with `out`, samples the state after
/// every event. `show_progress` false: no progress line (replays running side by side).
result replay_arcpool(const trace& t, arcpool_driver_kind_t driver, size_t capacity, bool cache,
                      series* out = nullptr, int device = 0, bool show_progress = true) {
  result r;
  r.mode = cache ? "arcpool" : "arcpool (cache off)";
  arcpool_allocator_t* a = make(driver, capacity, cache, device);
  auto streams = make_streams(a, t);
  struct held {
    arcpool_allocation_t* handle;
    size_t size;
    size_t stream_index;  // in out->streams
  };
  std::unordered_map<uint64_t, held> live;
  live.reserve(t.events.size());
  std::unordered_map<uint64_t, size_t> stream_index;
  std::vector<uint64_t> stream_bytes;
  if (out != nullptr) {
    // The streams that allocate: bytes count on the stream that allocated them (a stream that
    // only frees holds none, and the log's plot has no such stream either).
    for (const event& e : t.events) {
      if (e.allocate && stream_index.emplace(e.stream, out->streams.size()).second)
        out->streams.push_back(e.stream);
    }
    out->stream_in_use.resize(out->streams.size());
    stream_bytes.resize(out->streams.size());
  }
  arcpool::tools::progress line(r.mode.c_str(), "events");
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    if (show_progress && i % kProgressEvery == 0) line.update(i, double(i) / t.events.size());
    arcpool_stream_t s = streams[e.stream];
    if (e.allocate) {
      arcpool_allocation_t* h = nullptr;
      if (arcpool_allocate_async(a, e.size, 0, s, 0, &h) == ARCPOOL_STATUS_SUCCESS) {
        const size_t index = out != nullptr ? stream_index[e.stream] : 0;
        live[e.pointer] = {h, e.size, index};
        if (out != nullptr) stream_bytes[index] += e.size;
      } else {
        ++r.failures;
      }
    } else if (auto it = live.find(e.pointer); it != live.end()) {
      if (out != nullptr) stream_bytes[it->second.stream_index] -= it->second.size;
      arcpool_deallocate_async(it->second.handle, s, 0);
      arcpool_allocation_release(it->second.handle);
      live.erase(it);
    }
    if (out != nullptr) sample(a, e.time, stream_bytes, out);
  }
  settle(a, streams);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  arcpool_stats_t st{};
  st.struct_size = sizeof(st);
  st.version = ARCPOOL_STATS_VERSION;
  arcpool_stats_get(a, &st);
  r.peak_reserved = st.pool_reserved_bytes_peak;
  r.peak_in_use = st.bytes_in_use_peak;
  for (auto& [key, h] : live) {
    arcpool_deallocate_async(h.handle, streams[0], ARCPOOL_DEALLOCATE_FLAG_FORCE);
    arcpool_allocation_release(h.handle);
  }
  settle(a, streams);
  arcpool_allocator_trim(a, 0);
  for (auto& [key, s] : streams) {
    if (s != nullptr) arcpool_stream_destroy(a, s);
  }
  arcpool_allocator_destroy(a);
  return r;
}

/// The raw driver pool (an arcpool-configured pool used directly: cudaMallocFromPoolAsync /
/// cudaFreeAsync on the CUDA driver), frees on the trace's stream. A free on another stream than
/// the allocation's is ordered after the allocation's stream with an event record and wait, as
/// a correct program must (cudaFreeAsync on an unordered stream is a use before allocation).
result replay_raw(const trace& t, arcpool_driver_kind_t driver, size_t capacity) {
  result r;
  r.mode = "raw driver pool";
  arcpool_allocator_t* a = make(driver, capacity, false);
  arcpool::detail::driver& drv = arcpool::detail::from_handle(a)->drv();
  auto streams = make_streams(a, t);
  struct block {
    void* pointer;
    size_t bytes;
    arcpool_stream_t stream;
  };
  std::unordered_map<uint64_t, block> live;
  live.reserve(t.events.size());
  arcpool::detail::event_handle order = nullptr;
  if (drv.event_create(&order) != ARCPOOL_STATUS_SUCCESS) ++r.failures;
  uint64_t in_use = 0;
  arcpool::tools::progress line(r.mode.c_str(), "events");
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < t.events.size(); ++i) {
    const event& e = t.events[i];
    if (i % kProgressEvery == 0) line.update(i, double(i) / t.events.size());
    arcpool_stream_t s = streams[e.stream];
    if (e.allocate) {
      void* p = nullptr;
      if (e.size == 0) continue;
      if (drv.pool_allocate(e.size, s, &p) == ARCPOOL_STATUS_SUCCESS) {
        live[e.pointer] = {p, e.size, s};
        in_use += e.size;
        if (in_use > r.peak_in_use) r.peak_in_use = in_use;
      } else {
        ++r.failures;
      }
    } else if (auto it = live.find(e.pointer); it != live.end()) {
      const block& b = it->second;
      if (b.stream != s && order != nullptr &&
          (drv.event_record(order, b.stream) != ARCPOOL_STATUS_SUCCESS ||
           drv.stream_wait_event(s, order) != ARCPOOL_STATUS_SUCCESS)) {
        ++r.failures;
      }
      drv.pool_free(b.pointer, b.bytes, s);
      in_use -= b.bytes;
      live.erase(it);
    }
  }
  settle(a, streams);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.peak_reserved = drv.pool_query().reserved_peak;
  for (auto& [key, b] : live)
    drv.pool_free(b.pointer, b.bytes, streams[0]);  // after settle: every stream is idle
  settle(a, streams);
  if (order != nullptr) drv.event_destroy(order);
  for (auto& [key, s] : streams) {
    if (s != nullptr) arcpool_stream_destroy(a, s);
  }
  arcpool_allocator_destroy(a);
  return r;
}

void write_numbers(FILE* f, const char* name, const std::vector<uint64_t>& v) {
  std::fprintf(f, "\"%s\": [", name);
  for (size_t i = 0; i < v.size(); ++i)
    std::fprintf(f, "%s%" PRIu64, i ? ", " : "", v[i]);
  std::fprintf(f, "]");
}

/// Writes `s` as the JSON `python -m arcpool plot` reads (design.md §11).
bool write_series(const char* path, const trace& t, arcpool_driver_kind_t driver, const series& s) {
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) {
    std::fprintf(stderr, "arcpool-replay: cannot write %s\n", path);
    return false;
  }
  std::fprintf(f, "{\"source\": \"arcpool-replay\", \"trace\": \"%s\", \"driver\": \"%s\", ",
               t.name.c_str(), arcpool_driver_name(driver));
  std::fprintf(f, "\"mode\": \"arcpool\", \"peak_live\": %" PRIu64 ", \"time_s\": [", t.peak_live);
  for (size_t i = 0; i < s.time.size(); ++i)
    std::fprintf(f, "%s%.6f", i ? ", " : "", s.time[i]);
  std::fprintf(f, "], \"streams\": {");
  for (size_t i = 0; i < s.streams.size(); ++i) {
    std::fprintf(f, "%s\"0x%" PRIx64 "\": {", i ? ", " : "", s.streams[i]);
    write_numbers(f, "in_use", s.stream_in_use[i]);
    std::fprintf(f, "}");
  }
  std::fprintf(f, "}, \"total\": {");
  write_numbers(f, "in_use", s.in_use);
  std::fprintf(f, ", ");
  write_numbers(f, "held", s.held);
  std::fprintf(f, ", ");
  write_numbers(f, "cached", s.cached);
  std::fprintf(f, "}}\n");
  return std::fclose(f) == 0;
}

/// --devices: trace i on device i, all at once; prints (and writes to `out`) each device's
/// peaks. Returns 1 when an allocation failed.
int replay_devices(const std::vector<const char*>& paths, arcpool_driver_kind_t driver,
                   size_t capacity, FILE* out) {
  std::vector<trace> traces(paths.size());
  for (size_t i = 0; i < paths.size(); ++i) {
    if (!load(paths[i], &traces[i])) return 1;
  }
  std::vector<result> results(paths.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < paths.size(); ++i) {
    threads.emplace_back([&, i] {
      results[i] = replay_arcpool(traces[i], driver, capacity, /*cache=*/true, nullptr,
                                  static_cast<int>(i), /*show_progress=*/false);
    });
  }
  for (std::thread& t : threads)
    t.join();
  std::printf("\n%-8s %-28s %9s %18s %18s %18s %9s\n", "device", "trace", "events", "peak live",
              "peak in use", "peak reserved", "failures");
  if (out != nullptr) std::fprintf(out, "\"devices\": [");
  int failed = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    const trace& t = traces[i];
    const result& r = results[i];
    std::printf("%-8zu %-28s %9zu %18" PRIu64 " %18" PRIu64 " %18" PRIu64 " %9" PRIu64 "\n", i,
                t.name.c_str(), t.events.size(), t.peak_live, r.peak_in_use, r.peak_reserved,
                r.failures);
    if (out != nullptr) {
      std::fprintf(out,
                   "%s{\"device\": %zu, \"trace\": \"%s\", \"events\": %zu, \"peak_live\": %" PRIu64
                   ", \"peak_in_use\": %" PRIu64 ", \"peak_reserved\": %" PRIu64
                   ", \"failures\": %" PRIu64 "}",
                   i ? ", " : "", i, t.name.c_str(), t.events.size(), t.peak_live, r.peak_in_use,
                   r.peak_reserved, r.failures);
    }
    if (r.failures != 0) failed = 1;
  }
  if (out != nullptr) std::fprintf(out, "]");
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  arcpool_driver_kind_t driver = ARCPOOL_DRIVER_AUTO;
  size_t capacity = size_t{64} << 30;
  const char* json = nullptr;
  const char* series_path = nullptr;
  bool devices = false;
  std::vector<const char*> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--driver" && i + 1 < argc) {
      const std::string d = argv[++i];
      if (d == "cuda") {
        driver = ARCPOOL_DRIVER_CUDA;
      } else if (d == "host") {
        driver = ARCPOOL_DRIVER_HOST;
      } else if (d == "null") {
        driver = ARCPOOL_DRIVER_NULL;
      } else if (d == "auto") {
        driver = ARCPOOL_DRIVER_AUTO;
      } else {
        std::fprintf(stderr, "arcpool-replay: --driver %s is none of auto, cuda, host, null\n",
                     d.c_str());
        return 2;
      }
    } else if (a == "--capacity" && i + 1 < argc) {
      const char* text = argv[++i];
      char* end = nullptr;
      errno = 0;
      capacity = std::strtoull(text, &end, 10);
      if (end == text || *end != '\0' || errno != 0 || text[0] == '-') {
        std::fprintf(stderr, "arcpool-replay: --capacity %s is not a number of bytes\n", text);
        return 2;
      }
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (a == "--series" && i + 1 < argc) {
      series_path = argv[++i];
    } else if (a == "--devices") {
      devices = true;
    } else if (!a.empty() && a[0] != '-') {
      paths.push_back(argv[i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--driver auto|cuda|host|null] [--capacity BYTES] [--json FILE] "
                   "[--series FILE | --devices] TRACE.csv...\n",
                   argv[0]);
      return 2;
    }
  }
  if (paths.empty()) {
    std::fprintf(stderr, "arcpool-replay: no trace given\n");
    return 2;
  }
  if (series_path != nullptr && devices) {
    std::fprintf(stderr, "arcpool-replay: --series and --devices do not go together\n");
    return 2;
  }
  if (series_path != nullptr && paths.size() != 1) {
    std::fprintf(stderr, "arcpool-replay: --series takes exactly one trace (%zu given)\n",
                 paths.size());
    return 2;
  }
  {
    arcpool_allocator_t* probe = make(driver, capacity, true);
    driver = arcpool_allocator_driver(probe);
    arcpool_allocator_destroy(probe);
  }
  std::printf("arcpool-replay: %s driver\n", arcpool_driver_name(driver));
  FILE* out = json != nullptr ? std::fopen(json, "w") : nullptr;
  if (json != nullptr && out == nullptr) {
    std::fprintf(stderr, "arcpool-replay: cannot write %s: %s\n", json, std::strerror(errno));
    return 1;
  }
  if (devices) {
    if (out != nullptr) std::fprintf(out, "{\"driver\": \"%s\", ", arcpool_driver_name(driver));
    const int status = replay_devices(paths, driver, capacity, out);
    if (out != nullptr) {
      std::fprintf(out, "}\n");
      std::fclose(out);
    }
    return status;
  }
  if (out != nullptr)
    std::fprintf(out, "{\"driver\": \"%s\", \"traces\": [", arcpool_driver_name(driver));
  int failed = 0;
  for (size_t ti = 0; ti < paths.size(); ++ti) {
    trace t;
    if (!load(paths[ti], &t)) return 1;
    std::printf("\n%s: %zu events, %zu streams, peak live %" PRIu64 " bytes\n", t.name.c_str(),
                t.events.size(), t.streams, t.peak_live);
    std::printf("%-22s %12s %18s %18s %12s %14s %9s\n", "mode", "ns/event", "peak in use",
                "peak reserved", "vs live", "vs raw pool", "failures");
    const result raw = replay_raw(t, driver, capacity);
    const result runs[] = {raw, replay_arcpool(t, driver, capacity, true),
                           replay_arcpool(t, driver, capacity, false)};
    if (out != nullptr) {
      std::fprintf(out,
                   "%s{\"trace\": \"%s\", \"events\": %zu, \"streams\": %zu, "
                   "\"peak_live\": %" PRIu64 ", \"modes\": [",
                   ti ? ", " : "", t.name.c_str(), t.events.size(), t.streams, t.peak_live);
    }
    for (size_t i = 0; i < 3; ++i) {
      const result& r = runs[i];
      const double ns = t.events.empty() ? 0 : r.seconds * 1e9 / t.events.size();
      const double vs_live = t.peak_live ? double(r.peak_reserved) / t.peak_live : 0;
      const double vs_raw = raw.peak_reserved ? double(r.peak_reserved) / raw.peak_reserved : 0;
      std::printf("%-22s %12.0f %18" PRIu64 " %18" PRIu64 " %12.3f %14.3f %9" PRIu64 "\n",
                  r.mode.c_str(), ns, r.peak_in_use, r.peak_reserved, vs_live, vs_raw, r.failures);
      if (out != nullptr) {
        std::fprintf(out,
                     "%s{\"mode\": \"%s\", \"ns_per_event\": %.1f, \"peak_in_use\": %" PRIu64
                     ", \"peak_reserved\": %" PRIu64
                     ", \"reserved_vs_live\": %.4f, \"reserved_vs_raw\": %.4f, "
                     "\"failures\": %" PRIu64 "}",
                     i ? ", " : "", r.mode.c_str(), ns, r.peak_in_use, r.peak_reserved, vs_live,
                     vs_raw, r.failures);
      }
      if (r.failures != 0) failed = 1;
    }
    if (out != nullptr) std::fprintf(out, "]}");
    if (series_path != nullptr) {
      // A separate replay: sampling after every event would distort the timed ones above.
      series s;
      if (replay_arcpool(t, driver, capacity, true, &s).failures != 0) failed = 1;
      if (!write_series(series_path, t, driver, s)) return 1;
    }
  }
  if (out != nullptr) {
    std::fprintf(out, "]}\n");
    std::fclose(out);
  }
  return failed;
}
