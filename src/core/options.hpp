// Allocator options: defaults, validation and the resolved configuration.
#pragma once

#include "arcpool/arcpool.h"
#include "drivers/driver.hpp"

namespace arcpool::detail {

/// The routing arcpool uses where the options say ARCPOOL_ROUTING_DEFAULT. Provisional until
/// the GPU benchmarks decide (docs/routing.md).
inline constexpr arcpool_routing_t kDefaultForeignStreamRouting = ARCPOOL_ROUTING_DEFERRED;
inline constexpr arcpool_routing_t kDefaultUseRecordRouting = ARCPOOL_ROUTING_DEFERRED;

/// Options of one allocator, validated, with every default resolved.
struct allocator_config {
  driver_config driver;
  size_t hard_limit_bytes = 0;  ///< 0: none
  arcpool_routing_t foreign_stream_routing = kDefaultForeignStreamRouting;
  arcpool_routing_t use_record_routing = kDefaultUseRecordRouting;
  size_t event_pool_capacity = 1024;
  size_t stream_cache_bytes = size_t{64} << 20;  ///< 0: the fast path is off
  size_t stream_cache_max_block = size_t{1} << 20;
  arcpool_oom_callback_t on_out_of_memory = nullptr;
  void* on_out_of_memory_user_data = nullptr;
  arcpool_before_free_t before_free = nullptr;
  void* before_free_user_data = nullptr;
  size_t history_entries = 0;  ///< 0: no memory history
};

/// Validates `options` (NULL: all defaults) into `out`. INVALID_ARGUMENT names the bad field.
arcpool_status_t resolve_options(const arcpool_allocator_options_t* options, allocator_config* out);

}  // namespace arcpool::detail
