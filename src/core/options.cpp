#include "core/options.hpp"

#include <cstddef>
#include <cstring>

#include "support/status.hpp"

namespace arcpool::detail {
namespace {

/// An enum field as the integer a C caller stored (loading an out-of-range value through the
/// C++ enum type would be undefined).
template <class E>
int raw_value(const E& field) {
  static_assert(sizeof(E) == sizeof(int));
  int value = 0;
  std::memcpy(&value, &field, sizeof(value));
  return value;
}

arcpool_routing_t resolve_routing(arcpool_routing_t r, arcpool_routing_t fallback) {
  return r == ARCPOOL_ROUTING_DEFAULT ? fallback : r;
}

bool valid_routing(const arcpool_routing_t& r) {
  return raw_value(r) >= ARCPOOL_ROUTING_DEFAULT && raw_value(r) <= ARCPOOL_ROUTING_DEFERRED;
}

}  // namespace

arcpool_status_t resolve_options(const arcpool_allocator_options_t* options,
                                 allocator_config* out) {
  arcpool_allocator_options_t defaults;
  arcpool_allocator_options_init(&defaults);
  const arcpool_allocator_options_t& o = options ? *options : defaults;
  if (o.struct_size < sizeof(arcpool_allocator_options_t) ||
      o.version != ARCPOOL_ALLOCATOR_OPTIONS_VERSION) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "allocator options: struct_size %zu / version %u do not match this library "
                "(call arcpool_allocator_options_init)",
                o.struct_size, o.version);
  }
  if (o.device < 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "allocator options: device %d", o.device);
  }
  if (raw_value(o.driver) < ARCPOOL_DRIVER_AUTO || raw_value(o.driver) > ARCPOOL_DRIVER_NULL) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "allocator options: driver %d",
                raw_value(o.driver));
  }
  if (raw_value(o.pool_source) < ARCPOOL_POOL_OWNED ||
      raw_value(o.pool_source) > ARCPOOL_POOL_DEVICE_CURRENT) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "allocator options: pool_source %d",
                raw_value(o.pool_source));
  }
  if (!valid_routing(o.foreign_stream_routing) || !valid_routing(o.use_record_routing)) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "allocator options: routing %d / %d is not an arcpool_routing_t",
                raw_value(o.foreign_stream_routing), raw_value(o.use_record_routing));
  }
  if (o.peer_device_count > 0 && o.peer_devices == nullptr) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "allocator options: peer_device_count %zu with peer_devices NULL",
                o.peer_device_count);
  }
  // On every driver: a list the CUDA driver would refuse is refused on the host drivers too.
  // (Whether a peer exists and can reach the device only the CUDA driver can tell.)
  for (size_t i = 0; i < o.peer_device_count; ++i) {
    const int peer = o.peer_devices[i];
    if (peer < 0 || peer == o.device) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "allocator options: peer_devices[%zu] is %d, %s",
                  i, peer, peer < 0 ? "not a device" : "the pool's own device");
    }
  }
  if (o.event_pool_capacity > ARCPOOL_MAX_EVENT_POOL_CAPACITY) {
    return fail(
        ARCPOOL_STATUS_INVALID_ARGUMENT,
        "allocator options: event_pool_capacity %zu is above %zu (each kept event is a CUDA "
        "event, and a thread's share of the pool is reserved at its first fence)",
        o.event_pool_capacity, size_t{ARCPOOL_MAX_EVENT_POOL_CAPACITY});
  }
  allocator_config c;
  c.driver.device = o.device;
  c.driver.kind = o.driver;
  c.driver.pool_source = o.pool_source;
  c.driver.release_threshold = o.release_threshold;
  c.driver.reuse_follow_event_dependencies = o.reuse_follow_event_dependencies != 0;
  c.driver.reuse_allow_opportunistic = o.reuse_allow_opportunistic != 0;
  c.driver.reuse_allow_internal_dependencies = o.reuse_allow_internal_dependencies != 0;
  c.driver.max_pool_bytes = o.max_pool_bytes;
  c.driver.ipc_handle_types = o.ipc_handle_types;
  c.driver.peer_devices.assign(o.peer_devices, o.peer_devices + o.peer_device_count);
  if (o.host_capacity_bytes != 0) c.driver.host_capacity_bytes = o.host_capacity_bytes;
  c.driver.host_reserve_only = o.host_reserve_only != 0;
  c.driver.host_deterministic_seed = o.host_deterministic_seed;
  c.hard_limit_bytes = o.hard_limit_bytes;
  c.foreign_stream_routing =
      resolve_routing(o.foreign_stream_routing, kDefaultForeignStreamRouting);
  c.use_record_routing = resolve_routing(o.use_record_routing, kDefaultUseRecordRouting);
  if (o.event_pool_capacity != 0) c.event_pool_capacity = o.event_pool_capacity;
  c.stream_cache_bytes = o.stream_cache_bytes;
  c.stream_cache_max_block = o.stream_cache_max_block;
  c.on_out_of_memory = o.on_out_of_memory;
  c.on_out_of_memory_user_data = o.on_out_of_memory_user_data;
  c.before_free = o.before_free;
  c.before_free_user_data = o.before_free_user_data;
  c.history_entries = o.history_entries;
  *out = std::move(c);
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace arcpool::detail

extern "C" void arcpool_allocator_options_init(arcpool_allocator_options_t* options) {
  if (options == nullptr) return;
  *options = arcpool_allocator_options_t{};
  options->struct_size = sizeof(arcpool_allocator_options_t);
  options->version = ARCPOOL_ALLOCATOR_OPTIONS_VERSION;
  options->device = 0;
  options->driver = ARCPOOL_DRIVER_AUTO;
  options->pool_source = ARCPOOL_POOL_OWNED;
  options->release_threshold = UINT64_MAX;
  options->reuse_follow_event_dependencies = 1;
  options->reuse_allow_opportunistic = 1;
  options->reuse_allow_internal_dependencies = 0;
  options->foreign_stream_routing = ARCPOOL_ROUTING_DEFAULT;
  options->use_record_routing = ARCPOOL_ROUTING_DEFAULT;
  options->stream_cache_bytes = size_t{64} << 20;
  options->stream_cache_max_block = size_t{1} << 20;
}
