// The C API's by-pointer entry points (frameworks, memory resources, the default allocator of
// each device) and the ambient-stream policy of callers that pass no stream.
#include <cstring>

#include "api/default_allocators.hpp"
#include "api/entry.hpp"
#include "core/allocation.hpp"
#include "core/allocator.hpp"
#include "core/pointer_map.hpp"
#include "support/status.hpp"

using arcpool::detail::allocation;
using arcpool::detail::allocator;
using arcpool::detail::fail;
using arcpool::detail::from_handle;
using arcpool::detail::api::guarded;
using arcpool::detail::api::null_argument;
using arcpool::detail::api::traced;
namespace nvtx = arcpool::detail::nvtx;

namespace {

/// allocator::free_by_pointer as a traced body.
constexpr auto free_by_pointer = [](void* p, arcpool_stream_t s, int device) {
  return allocator::free_by_pointer(p, s, device);
};

}  // namespace

extern "C" {

arcpool_status_t arcpool_default_allocator_set(int device, arcpool_allocator_t* allocator) {
  return guarded([&] {
    return arcpool::detail::set_default_allocator(
        device, allocator == nullptr ? nullptr : from_handle(allocator));
  });
}

arcpool_status_t arcpool_default_allocator_get(int device, arcpool_allocator_t** out_allocator) {
  ARCPOOL_REQUIRE_ARG(out_allocator);
  return guarded([&] {
    arcpool::detail::allocator* a = nullptr;
    ARCPOOL_RETURN_IF_ERROR(arcpool::detail::default_allocator(device, &a));
    *out_allocator = arcpool::detail::to_handle(a);
    a->release();  // borrowed from the table, which keeps its own reference until replaced
    return ARCPOOL_STATUS_SUCCESS;
  });
}

arcpool_status_t arcpool_default_allocator_find(int device, arcpool_allocator_t** out_allocator) {
  ARCPOOL_REQUIRE_ARG(out_allocator);
  return guarded([&] {
    arcpool::detail::allocator* a = nullptr;
    ARCPOOL_RETURN_IF_ERROR(arcpool::detail::default_allocator(device, &a, /*create=*/false));
    *out_allocator = a == nullptr ? nullptr : arcpool::detail::to_handle(a);
    if (a != nullptr) a->release();  // borrowed, as arcpool_default_allocator_get's
    return ARCPOOL_STATUS_SUCCESS;
  });
}

void* arcpool_malloc_async(size_t size, int device, arcpool_stream_t stream) {
  if (size == 0) return nullptr;
  void* data = nullptr;
  traced(
      nvtx::op::allocate, size, stream,
      [](size_t n, int d, arcpool_stream_t s, void** out) {
        return arcpool::detail::with_default_allocator(
            d, [&](arcpool::detail::allocator& a) { return a.malloc_by_pointer(n, 0, s, out); });
      },
      size, device, stream, &data);
  return data;
}

arcpool_status_t arcpool_free_async(void* pointer, size_t, int device, arcpool_stream_t stream) {
  if (pointer == nullptr) return ARCPOOL_STATUS_SUCCESS;
  // A negative device is free_by_pointer's "any device" (arcpool_allocator_free_async's): a
  // caller's is refused, as arcpool_malloc_async refuses it, with nothing freed.
  if (device < 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "free of %p on device %d: no such device", pointer,
                device);
  }
  return traced(nvtx::op::deallocate, 0, stream, free_by_pointer, pointer, stream, device);
}

arcpool_status_t arcpool_record_stream(void* pointer, arcpool_stream_t stream) {
  return arcpool_record_stream_with_flags(pointer, stream, 0);
}

arcpool_status_t arcpool_record_stream_with_flags(void* pointer, arcpool_stream_t stream,
                                                  uint32_t flags) {
  ARCPOOL_REQUIRE_ARG(pointer);
  return traced(
      nvtx::op::record_use, 0, stream,
      [](void* p, arcpool_stream_t s, uint32_t f) {
        allocation* a = arcpool::detail::by_pointer_allocations().find(p);
        if (a == nullptr) {
          return fail(ARCPOOL_STATUS_UNKNOWN_POINTER,
                      "record_stream of %p: no live by-pointer allocation contains it", p);
        }
        // Guarded here, not only at the entry point: a throw (no host memory for the use record
        // or the stream's lookup) must still drop the reference find took.
        const arcpool_status_t status =
            arcpool::detail::api::guarded([&] { return a->owner.record_use(*a, s, f); });
        a->release();
        return status;
      },
      pointer, stream, flags);
}

arcpool_status_t arcpool_allocator_malloc_async(arcpool_allocator_t* allocator, size_t size,
                                                size_t alignment, arcpool_stream_t stream,
                                                void** out_pointer) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_pointer);
  return traced(
      nvtx::op::allocate, size, stream,
      [](arcpool::detail::allocator* a, size_t n, size_t align, arcpool_stream_t s, void** out) {
        return a->malloc_by_pointer(n, align, s, out);
      },
      from_handle(allocator), size, alignment, stream, out_pointer);
}

arcpool_status_t arcpool_allocator_free_async(arcpool_allocator_t* allocator, void* pointer,
                                              arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return traced(nvtx::op::deallocate, 0, stream, free_by_pointer, pointer, stream, -1);
}

arcpool_status_t arcpool_allocator_set_hard_limit(arcpool_allocator_t* allocator, size_t bytes) {
  ARCPOOL_REQUIRE_ARG(allocator);
  from_handle(allocator)->set_hard_limit(bytes);
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t arcpool_allocator_device_memory(const arcpool_allocator_t* allocator,
                                                 size_t* out_bytes) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_bytes);
  return guarded([&] { return from_handle(allocator)->drv().device_memory(out_bytes); });
}

arcpool_status_t arcpool_allocator_set_ambient_stream(arcpool_allocator_t* allocator,
                                                      arcpool_ambient_policy_t policy,
                                                      arcpool_stream_t stream) {
  ARCPOOL_REQUIRE_ARG(allocator);
  int raw = 0;
  std::memcpy(&raw, &policy, sizeof(raw));  // a C caller may pass any integer
  if (raw < ARCPOOL_AMBIENT_LEGACY_DEFAULT || raw > ARCPOOL_AMBIENT_SYNCHRONIZE) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "ambient policy %d", raw);
  }
  return guarded([&] { return from_handle(allocator)->set_ambient(policy, stream); });
}

arcpool_status_t arcpool_ambient_malloc(arcpool_allocator_t* allocator, size_t size,
                                        void** out_pointer) {
  ARCPOOL_REQUIRE_ARG(allocator);
  ARCPOOL_REQUIRE_ARG(out_pointer);
  return traced(
      nvtx::op::allocate, size, nullptr,
      [](arcpool::detail::allocator* a, size_t n, void** out) { return a->ambient_malloc(n, out); },
      from_handle(allocator), size, out_pointer);
}

arcpool_status_t arcpool_ambient_free(arcpool_allocator_t* allocator, void* pointer) {
  ARCPOOL_REQUIRE_ARG(allocator);
  return traced(
      nvtx::op::deallocate, 0, nullptr,
      [](arcpool::detail::allocator* a, void* p) { return a->ambient_free(p); },
      from_handle(allocator), pointer);
}

}  // extern "C"
