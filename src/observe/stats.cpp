#include "observe/stats.hpp"

namespace arcpool::detail {

void stats::read(const pool_figures& pool, arcpool_stats_t* out) const {
#define ARCPOOL_STATS_READ_GAUGE_(name, doc)                   \
  out->name##_current = static_cast<uint64_t>(name.current()); \
  out->name##_peak = static_cast<uint64_t>(name.peak());
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_READ_GAUGE_)
#undef ARCPOOL_STATS_READ_GAUGE_
#define ARCPOOL_STATS_READ_COUNTER_(name, doc) out->name = static_cast<uint64_t>(name.sum());
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_READ_COUNTER_)
#undef ARCPOOL_STATS_READ_COUNTER_
  out->pool_reserved_bytes_current = pool.reserved_current;
  out->pool_reserved_bytes_peak = pool.reserved_peak;
  out->pool_used_bytes_current = pool.used_current;
}

void stats::reset_peaks() {
#define ARCPOOL_STATS_RESET_GAUGE_(name, doc) name.reset_peak();
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_RESET_GAUGE_)
#undef ARCPOOL_STATS_RESET_GAUGE_
}

std::string stats_to_json(const arcpool_stats_t& s) {
  std::string json = "{";
  auto field = [&json](const char* name, uint64_t value) {
    if (json.size() > 1) json += ", ";
    json += '"';
    json += name;
    json += "\": ";
    json += std::to_string(value);
  };
#define ARCPOOL_STATS_JSON_GAUGE_(name, doc) \
  field(#name "_current", s.name##_current); \
  field(#name "_peak", s.name##_peak);
  ARCPOOL_STATS_GAUGES(ARCPOOL_STATS_JSON_GAUGE_)
#undef ARCPOOL_STATS_JSON_GAUGE_
#define ARCPOOL_STATS_JSON_COUNTER_(name, doc) field(#name, s.name);
  ARCPOOL_STATS_COUNTERS(ARCPOOL_STATS_JSON_COUNTER_)
#undef ARCPOOL_STATS_JSON_COUNTER_
  field("pool_reserved_bytes_current", s.pool_reserved_bytes_current);
  field("pool_reserved_bytes_peak", s.pool_reserved_bytes_peak);
  field("pool_used_bytes_current", s.pool_used_bytes_current);
  json += "}";
  return json;
}

}  // namespace arcpool::detail
