// The C API: the one choke point. Each entry validates its arguments, then calls the model.
// No exception crosses it. This file: allocators, streams, allocations and graph pools; the
// by-pointer entry points are c_api_by_pointer.cpp, the statistics c_api_stats.cpp, IPC
// ipc_api.cpp.
#include <cstddef>
#include <cstring>

#include "api/entry.hpp"
#include "core/allocation.hpp"
#include "core/allocator.hpp"
#include "core/graph_pool.hpp"
#include "support/status.hpp"

using arcpool::detail::allocation;
using arcpool::detail::allocator;
using arcpool::detail::fail;
using arcpool::detail::from_handle;
using arcpool::detail::api::guarded;
using arcpool::detail::api::null_argument;
using arcpool::detail::api::traced;
namespace nvtx = arcpool::detail::nvtx;
using arcpool::detail::api::copy_versioned;

namespace {

allocation& record_of(arcpool_allocation_t* handle) {
  return *handle->record;
}

}  // namespace

extern "C" {

int arcpool_version(void) {
  return ARCPOOL_VERSION;
}

const char* arcpool_driver_name(arcpool_driver_kind_t kind) {
  switch (kind) {
    case ARCPOOL_DRIVER_AUTO:
      return "auto";
    case ARCPOOL_DRIVER_CUDA:
      return "cuda";
    case ARCPOOL_DRIVER_HOST:
      return "host";
    case ARCPOOL_DRIVER_NULL:
      return "null";
  }
  return "unknown";
}

arcpool_driver_kind_t arcpool_auto_driver(int device) {
  (void)device;  // the same for every device (arcpool.h)
  return arcpool::detail::resolve_auto_driver();
}

// --- Allocators ------------------------------------------------------------------------------

arcpool_status_t arcpool_allocator_create(const arcpool_allocator_options_t* options,
                                          arcpool_allocator_t** out_allocator) {
  ARCPOOL_REQUIRE_ARG(out_allocator);
  return guarded([&] {
    arcpool::detail::allocator_config config;
    ARCPOOL_RETURN_IF_ERROR(arcpool::detail::resolve_options(options, &config));
    allocator* a = nullptr;
    ARCPOOL_RETURN_IF_ERROR(allocator::create(config, &a));
    *out_allocator = arcpool::detail::to_handle(a);
    return ARCPOOL_STATUS_SUCCESS;
  });
}

void arcpool_allocator_destroy(arcpool_allocator_t* allocator) {
  if (allocator != nullptr) from_handle(allocator)->release();
}

arcpool_status_t arcpool_allocator_retain(arcpool_allocator_t* allocator) {
  ARCPOOL_REQUIRE_ARG(allocator);
  from_handle(allocator)->retain();
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_driver_kind_t arcpool_allocator_driver(const arcpool_allocator_t* allocator) {
  if (allocator == nullptr) return ARCPOOL_DRIVER_AUTO;
  return from_handle(allocator)->drv().kind();
}

int arcpool_allocator_device(const arcpool_allocator_t* allocator) {
  if (allocator == nullptr) return -1;
  return from_handle(allocator)->drv().device();
}

arcpool_status_t arcpool_allocator_trim(arcpool_allocator_t* allocator, size_t keep_bytes) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return traced(
      nvtx::op::trim, keep_bytes, nullptr,
      [](arcpool::detail::allocator* a, size_t keep) { return a->trim(keep); },
      from_handle(allocator), keep_bytes);
}

arcpool_status_t arcpool_allocator_synchronize_device(arcpool_allocator_t* allocator) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return guarded([&] { return from_handle(allocator)->drv().device_synchronize(); });
}

arcpool_status_t arcpool_allocator_log_open(arcpool_allocator_t* allocator, const char* path) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(path);
  return guarded([&] { return from_handle(allocator)->log().open(path); });
}

arcpool_status_t arcpool_allocator_log_close(arcpool_allocator_t* allocator) {
  ARCPOOL_REQUIRE_ARG(allocator);
  from_handle(allocator)->log().close();
  return ARCPOOL_STATUS_SUCCESS;
}

// --- Streams ---------------------------------------------------------------------------------

arcpool_status_t arcpool_stream_create(arcpool_allocator_t* allocator,
                                       arcpool_stream_t* out_stream) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_stream);
  return guarded([&] { return from_handle(allocator)->create_stream(out_stream); });
}

arcpool_status_t arcpool_stream_destroy(arcpool_allocator_t* allocator, arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return guarded([&] { return from_handle(allocator)->destroy_stream(stream); });
}

arcpool_status_t arcpool_stream_synchronize(arcpool_allocator_t* allocator,
                                            arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return guarded([&] { return from_handle(allocator)->synchronize_stream(stream); });
}

arcpool_status_t arcpool_stream_register(arcpool_allocator_t* allocator, arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return guarded([&] { return from_handle(allocator)->register_stream(stream); });
}

arcpool_status_t arcpool_stream_unregister(arcpool_allocator_t* allocator,
                                           arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return guarded([&] { return from_handle(allocator)->unregister_stream(stream); });
}

arcpool_status_t arcpool_stream_launch_host_func(arcpool_allocator_t* allocator,
                                                 arcpool_stream_t stream, arcpool_host_fn_t fn,
                                                 void* user_data) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(fn);
  return guarded(
      [&] { return from_handle(allocator)->drv().launch_host_func(stream, fn, user_data); });
}

// --- Allocations -----------------------------------------------------------------------------

arcpool_status_t arcpool_allocate_async(arcpool_allocator_t* allocator, size_t size,
                                        size_t alignment, arcpool_stream_t stream, uint32_t flags,
                                        arcpool_allocation_t** out_allocation) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_allocation);
  return traced(
      nvtx::op::allocate, size, stream,
      [](arcpool::detail::allocator* owner, size_t n, size_t align, arcpool_stream_t s, uint32_t f,
         arcpool_allocation_t** out) {
        allocation* a = nullptr;
        ARCPOOL_RETURN_IF_ERROR(owner->allocate(n, align, s, f, &a));
        *out = a;
        return ARCPOOL_STATUS_SUCCESS;
      },
      from_handle(allocator), size, alignment, stream, flags, out_allocation);
}

arcpool_status_t arcpool_deallocate_async(arcpool_allocation_t* allocation, arcpool_stream_t stream,
                                          uint32_t flags) {
  ARCPOOL_REQUIRE_ARG(allocation);
  return traced(
      nvtx::op::deallocate, allocation->size, stream,
      [](arcpool::detail::allocation* a, arcpool_stream_t s, uint32_t f) {
        return a->owner.deallocate(*a, s, f);
      },
      allocation->record, stream, flags);
}

arcpool_status_t arcpool_allocation_preserve(arcpool_allocation_t* allocation) {
  ARCPOOL_REQUIRE_ARG(allocation);
  return traced(
      nvtx::op::preserve, allocation->size, nullptr,
      [](arcpool::detail::allocation* a) { return a->owner.preserve(*a); }, allocation->record);
}

arcpool_status_t arcpool_allocation_discard(arcpool_allocation_t* allocation, int* out_was_last) {
  ARCPOOL_REQUIRE_ARG(allocation);
  return traced(
      nvtx::op::discard, allocation->size, nullptr,
      [](arcpool::detail::allocation* a, int* was_last) {
        bool last = false;
        ARCPOOL_RETURN_IF_ERROR(a->owner.discard(*a, &last));
        if (was_last != nullptr) *was_last = last ? 1 : 0;
        return ARCPOOL_STATUS_SUCCESS;
      },
      allocation->record, out_was_last);
}

int arcpool_allocation_is_terminal(const arcpool_allocation_t* allocation) {
  return allocation != nullptr && allocation->record->owners.is_terminal() ? 1 : 0;
}

arcpool_status_t arcpool_allocation_discard_and_release(arcpool_allocation_t* allocation) {
  ARCPOOL_REQUIRE_ARG(allocation);
  return traced(
      nvtx::op::discard, allocation->size, nullptr,
      [](arcpool_allocation_t* handle) {
        // The reference goes whatever the status, a deallocation refused by a throw (no host
        // memory) included: the caller may not use the handle again.
        struct release_at_exit {
          arcpool_allocation_t* handle;
          ~release_at_exit() { arcpool::detail::release_handle(handle); }
        } release{handle};
        auto& a = record_of(handle);
        bool last = false;
        arcpool_status_t status = a.owner.discard(a, &last);
        if (status == ARCPOOL_STATUS_SUCCESS && last) status = a.owner.deallocate_on_current(a);
        return status;
      },
      allocation);
}

arcpool_status_t arcpool_allocation_retain(arcpool_allocation_t* allocation) {
  ARCPOOL_REQUIRE_ARG(allocation);
  arcpool::detail::retain_handle(allocation);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t arcpool_allocation_release(arcpool_allocation_t* allocation) {
  if (allocation != nullptr) arcpool::detail::release_handle(allocation);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t arcpool_allocation_placement(const arcpool_allocation_t* allocation,
                                              arcpool_placement_t* out_placement) {
  ARCPOOL_REQUIRE_ARG(allocation);
  ARCPOOL_REQUIRE_ARG(out_placement);
  const auto& p = allocation->record->placement;
  arcpool_placement_t full{};
  full.device = allocation->record->owner.drv().device();
  full.origin_stream = p.origin.handle;
  full.origin_stream_id = p.origin.id;
  full.flags = p.placement_flags;
  full.size = p.size;
  full.alignment = p.alignment;
  return copy_versioned(full, out_placement, __func__);
}

arcpool_status_t arcpool_allocation_info(const arcpool_allocation_t* allocation,
                                         arcpool_allocation_info_t* out_info) {
  ARCPOOL_REQUIRE_ARG(allocation);
  ARCPOOL_REQUIRE_ARG(out_info);
  auto& a = *allocation->record;
  arcpool_allocation_info_t full{};
  const auto snapshot = a.owners.load();
  full.state = snapshot.st;
  full.owners = snapshot.owners;
  full.references = a.refs.load();
  full.id = a.placement.serial;
  {
    std::lock_guard<arcpool::detail::spinlock> lock(a.mutex);
    full.current_stream = a.current.handle;
    full.current_stream_id = a.current.id;
    full.use_records = static_cast<uint32_t>(a.uses.size());
  }
  return copy_versioned(full, out_info, __func__);
}

arcpool_status_t arcpool_allocation_data(const arcpool_allocation_t* allocation, void** out_data) {
  ARCPOOL_REQUIRE_ARG(allocation);
  ARCPOOL_REQUIRE_ARG(out_data);
  const auto& a = *allocation->record;
  const auto st = a.owners.load().st;
  if (st != ARCPOOL_ALLOCATION_LIVE && st != ARCPOOL_ALLOCATION_UNOWNED) {
    // Named without describe(), whose std::string needs host memory: this call is not guarded.
    return fail(ARCPOOL_STATUS_ALREADY_DEALLOCATED,
                "data of allocation #%llu (%zu bytes at %p): it was already %s",
                static_cast<unsigned long long>(a.placement.serial), a.placement.size,
                a.placement.data, st == ARCPOOL_ALLOCATION_EXPORTED ? "exported" : "deallocated");
  }
  *out_data = a.placement.data == nullptr
                  ? nullptr
                  : static_cast<char*>(a.placement.data) + allocation->offset;
  return ARCPOOL_STATUS_SUCCESS;
}

size_t arcpool_allocation_size(const arcpool_allocation_t* allocation) {
  return allocation == nullptr ? 0 : allocation->size;
}

arcpool_status_t arcpool_allocation_view(arcpool_allocation_t* allocation, size_t offset,
                                         size_t size, arcpool_allocation_t** out_view) {
  ARCPOOL_REQUIRE_ARG(allocation);
  ARCPOOL_REQUIRE_ARG(out_view);
  return guarded([&] {
    auto& a = record_of(allocation);
    const auto st = a.owners.load().st;
    if (st != ARCPOOL_ALLOCATION_LIVE && st != ARCPOOL_ALLOCATION_UNOWNED) {
      return fail(ARCPOOL_STATUS_ALREADY_DEALLOCATED, "view of %s: it was already %s",
                  a.describe().c_str(),
                  st == ARCPOOL_ALLOCATION_EXPORTED ? "exported" : "deallocated");
    }
    if (offset > allocation->size || size > allocation->size - offset) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "view [%zu, %zu + %zu) is out of bounds of a %zu-byte range of %s", offset,
                  offset, size, allocation->size, a.describe().c_str());
    }
    // The reference after the handle, so that a handle the host has no memory for takes none.
    auto* view =
        new (std::nothrow) arcpool_allocation(&a, allocation->offset + offset, size, /*view=*/true);
    if (view == nullptr) {
      return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for a view of %s",
                  a.describe().c_str());
    }
    a.retain();
    *out_view = view;
    return ARCPOOL_STATUS_SUCCESS;
  });
}

arcpool_status_t arcpool_allocation_export(arcpool_allocation_t* allocation, void** out_pointer) {
  ARCPOOL_REQUIRE_ARG(allocation);
  ARCPOOL_REQUIRE_ARG(out_pointer);
  return traced(
      nvtx::op::export_memory, allocation->size, nullptr,
      [](arcpool::detail::allocation* a, void** out) { return a->owner.export_memory(*a, out); },
      allocation->record, out_pointer);
}

arcpool_status_t arcpool_transfer(arcpool_allocation_t* allocation, arcpool_stream_t to_stream) {
  ARCPOOL_REQUIRE_ARG(allocation);
  return traced(
      nvtx::op::transfer, allocation->size, to_stream,
      [](arcpool::detail::allocation* a, arcpool_stream_t to) { return a->owner.transfer(*a, to); },
      allocation->record, to_stream);
}

arcpool_status_t arcpool_record_use(arcpool_allocation_t* allocation, arcpool_stream_t stream) {
  return arcpool_record_use_with_flags(allocation, stream, 0);
}

arcpool_status_t arcpool_record_use_with_flags(arcpool_allocation_t* allocation,
                                               arcpool_stream_t stream, uint32_t flags) {
  ARCPOOL_REQUIRE_ARG(allocation);
  return traced(
      nvtx::op::record_use, allocation->size, stream,
      [](arcpool::detail::allocation* a, arcpool_stream_t s, uint32_t f) {
        return a->owner.record_use(*a, s, f);
      },
      allocation->record, stream, flags);
}

arcpool_status_t arcpool_import(arcpool_allocator_t* allocator, void* pointer, size_t size,
                                arcpool_stream_t stream, uint32_t flags, arcpool_on_free_t on_free,
                                void* user_data, arcpool_allocation_t** out_allocation) {
  // A consuming import frees the foreign memory on every failure, this one included.
  const bool consume = (flags & ARCPOOL_IMPORT_FLAG_CONSUME) && on_free != nullptr;
  if (allocator == nullptr || out_allocation == nullptr) {
    if (consume) on_free(pointer, size, user_data);
    return null_argument(__func__, allocator == nullptr ? "allocator" : "out_allocation");
  }
  return traced(
      nvtx::op::import, size, stream,
      [](arcpool::detail::allocator* owner, void* p, size_t n, arcpool_stream_t s, uint32_t f,
         arcpool_on_free_t fn, void* data, arcpool_allocation_t** out) {
        allocation* a = nullptr;
        ARCPOOL_RETURN_IF_ERROR(owner->import(p, n, s, f, fn, data, &a));
        *out = a;
        return ARCPOOL_STATUS_SUCCESS;
      },
      from_handle(allocator), pointer, size, stream, flags, on_free, user_data, out_allocation);
}

// --- Graph pools -----------------------------------------------------------------------------

arcpool_status_t arcpool_graph_pool_create(arcpool_allocator_t* allocator,
                                           arcpool_graph_pool_t** out_pool) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_pool);
  *out_pool = nullptr;
  return guarded([&] {
    arcpool::detail::graph_pool* pool = nullptr;
    ARCPOOL_RETURN_IF_ERROR(from_handle(allocator)->create_graph_pool(&pool));
    *out_pool = pool->handle();
    return ARCPOOL_STATUS_SUCCESS;
  });
}

arcpool_status_t arcpool_graph_pool_begin(arcpool_graph_pool_t* pool, arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(pool);
  return guarded([&] {
    arcpool::detail::graph_pool& p = *arcpool::detail::graph_pool::from(pool);
    return p.owner().begin_graph_pool(p, stream);
  });
}

arcpool_status_t arcpool_graph_pool_end(arcpool_graph_pool_t* pool, arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(pool);
  return guarded([&] {
    arcpool::detail::graph_pool& p = *arcpool::detail::graph_pool::from(pool);
    return p.owner().end_graph_pool(p, stream);
  });
}

arcpool_status_t arcpool_graph_pool_release(arcpool_graph_pool_t* pool) {
  if (pool != nullptr) arcpool::detail::graph_pool::from(pool)->release();
  return ARCPOOL_STATUS_SUCCESS;
}

}  // extern "C"
