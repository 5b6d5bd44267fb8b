#include "observe/stats.hpp"

#include <algorithm>

namespace arcpool::detail {

stats::stats() noexcept = default;

bool stats::try_reserve(stat::gauge g, int64_t n, int64_t limit, int64_t* total) noexcept {
  std::atomic<int64_t>& value = totals_[g].value;
  int64_t now = value.load(std::memory_order_relaxed);
  do {
    if (n > limit || now > limit - n) return false;
  } while (!value.compare_exchange_weak(now, now + n, std::memory_order_relaxed));
  *total = now + n;
  return true;
}

int64_t stats::current(stat::gauge g) const noexcept {
  int64_t total = totals_[g].value.load(std::memory_order_relaxed);
  for (const shard& s : shards_)
    total += s.value[stat::kCounters + g].load(std::memory_order_relaxed);
  return total + moved(g);
}

int64_t stats::moved(stat::gauge g) const noexcept {
  int64_t total = 0;
  switch (g) {
    case stat::bytes_in_use:
      for (const shard& s : shards_)
        total += s.moved_bytes.load(std::memory_order_relaxed);
      return total;
    case stat::bytes_cached:
      for (const shard& s : shards_)
        total -= s.moved_bytes.load(std::memory_order_relaxed);
      return total;
    case stat::allocations_in_use:
      for (const shard& s : shards_)
        total += s.moved_allocations.load(std::memory_order_relaxed);
      return total;
    default:
      return 0;
  }
}

void stats::flush_in_use(shard& s) noexcept {
  auto take = [&s](stat::gauge g) {
    return s.value[stat::kCounters + g].exchange(0, std::memory_order_relaxed);
  };
  const int64_t moved_allocations = s.moved_allocations.exchange(0, std::memory_order_relaxed);
  const int64_t moved_bytes = s.moved_bytes.exchange(0, std::memory_order_relaxed);
  auto add = [this](stat::gauge g, int64_t n) {
    gauge_total& total = totals_[g];
    raise_peak(total, total.value.fetch_add(n, std::memory_order_relaxed) + n);
  };
  add(stat::allocations_in_use, take(stat::allocations_in_use) + moved_allocations);
  add(stat::bytes_in_use, take(stat::bytes_in_use) + moved_bytes);
  add(stat::bytes_cached, take(stat::bytes_cached) - moved_bytes);
}

int64_t stats::raw_sum(stat::counter c) const noexcept {
  int64_t total = 0;
  for (const shard& s : shards_)
    total += s.value[c].load(std::memory_order_relaxed);
  return total;
}

int64_t stats::sum(stat::counter c) const noexcept {
  const int64_t own = raw_sum(c);
  switch (c) {
    case stat::allocations:
      return own + raw_sum(stat::cache_hits);
    case stat::deallocations:
      return own + raw_sum(stat::fast_frees);
    case stat::cache_frees:
      return own + raw_sum(stat::cached_same_stream_frees) +
             raw_sum(stat::cached_cross_stream_frees) + raw_sum(stat::fast_frees);
    case stat::same_stream_frees:
      return own + raw_sum(stat::cached_same_stream_frees) + raw_sum(stat::fast_frees);
    case stat::cross_stream_frees:
      return own + raw_sum(stat::cached_cross_stream_frees);
    default:
      return own;
  }
}

void stats::read_gauge(stat::gauge g, uint64_t* current_out, uint64_t* peak_out) const noexcept {
  // One sum for both, so that the peak read is never below the current value read with it.
  // The shards are summed one by one while other threads move figures between them: for a
  // moment the sum can miss a rise whose fall it counts (an allocation on one thread freed on
  // another), and come out below zero, which no gauge can be.
  const int64_t now = std::max<int64_t>(current(g), 0);
  *current_out = static_cast<uint64_t>(now);
  *peak_out = static_cast<uint64_t>(std::max(totals_[g].peak.load(std::memory_order_relaxed), now));
}

void stats::read(const pool_figures& pool, arcpool_stats_t* out) const {
#define ARCPOOL_STATS_READ_GAUGE_(name, doc) \
  read_gauge(stat::name, &out->name##_current, &out->name##_peak);
#define ARCPOOL_STATS_READ_COUNTER_(name, doc) out->name = static_cast<uint64_t>(sum(stat::name));
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_READ_GAUGE_)
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_READ_COUNTER_)
  out->pool_reserved_bytes_current = pool.reserved_current;
  out->pool_reserved_bytes_peak = pool.reserved_peak;
  out->pool_used_bytes_current = pool.used_current;
  ARCPOOL_STATS_GRAPH_GAUGES(ARCPOOL_STATS_READ_GAUGE_)
  ARCPOOL_STATS_GRAPH_COUNTERS(ARCPOOL_STATS_READ_COUNTER_)
#undef ARCPOOL_STATS_READ_COUNTER_
#undef ARCPOOL_STATS_READ_GAUGE_
}

void stats::reset_peaks() noexcept {
  for (size_t g = 0; g < stat::kGauges; ++g) {
    totals_[g].peak.store(current(static_cast<stat::gauge>(g)), std::memory_order_relaxed);
  }
}

std::string stats_to_json(const arcpool_stats_t& s,
                          const std::vector<arcpool_stream_stats_t>& streams) {
  std::string json = "{";
  auto field = [&json](const char* name, uint64_t value) {
    if (json.back() != '{') json += ", ";
    json += '"';
    json += name;
    json += "\": ";
    json += std::to_string(value);
  };
#define ARCPOOL_STATS_JSON_GAUGE_(name, doc) \
  field(#name "_current", s.name##_current); \
  field(#name "_peak", s.name##_peak);
#define ARCPOOL_STATS_JSON_COUNTER_(name, doc) field(#name, s.name);
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_JSON_GAUGE_)
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_JSON_COUNTER_)
  field("pool_reserved_bytes_current", s.pool_reserved_bytes_current);
  field("pool_reserved_bytes_peak", s.pool_reserved_bytes_peak);
  field("pool_used_bytes_current", s.pool_used_bytes_current);
  ARCPOOL_STATS_GRAPH_GAUGES(ARCPOOL_STATS_JSON_GAUGE_)
  ARCPOOL_STATS_GRAPH_COUNTERS(ARCPOOL_STATS_JSON_COUNTER_)
#undef ARCPOOL_STATS_JSON_COUNTER_
#undef ARCPOOL_STATS_JSON_GAUGE_
  json += ", \"streams\": [";
  for (size_t i = 0; i < streams.size(); ++i) {
    const arcpool_stream_stats_t& r = streams[i];
    json += i ? ", {" : "{";
    field("stream", reinterpret_cast<uintptr_t>(r.stream));
    field("stream_id", r.stream_id);
    field("other", r.other);
    field("retired", r.retired);
    field("bytes_in_use_current", r.bytes_in_use_current);
    field("bytes_in_use_peak", r.bytes_in_use_peak);
    field("allocations", r.allocations);
    field("cache_hits", r.cache_hits);
    field("cross_stream_frees", r.cross_stream_frees);
    field("deferred_frees", r.deferred_frees);
    json += "}";
  }
  json += "]}";
  return json;
}

}  // namespace arcpool::detail
