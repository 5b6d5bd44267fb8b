// arcpool as a CCCL memory resource and as a Thrust allocator: anything that takes a CCCL
// resource ref (RMM's device_async_resource_ref among them), thrust::cuda::par_nosync(alloc) and
// CUB temporary storage can allocate from arcpool, stream-ordered.
//
// CCCL changed the concept between the versions arcpool is built against, and memory_resource
// satisfies each (a static_assert checks the one of the CCCL it is compiled with):
// - CCCL 2.x (2.7 ships with the header-only RMM 24.12) and 3.0 (CUDA 13.0's toolkit):
//   cuda::mr::async_resource, behind LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE (defined
//   here when the includer did not): allocate_async(bytes, alignment, stream),
//   deallocate_async(p, bytes, alignment, stream), allocate(bytes, alignment),
//   deallocate(p, bytes, alignment).
// - CCCL 3.5 (the one librmm-cu13 26.10 ships): the stream-first cuda::mr::resource:
//   allocate(stream, bytes, alignment), deallocate(stream, p, bytes, alignment),
//   allocate_sync(bytes, alignment), deallocate_sync(p, bytes, alignment).
// Never include this header with two CCCLs on the include path. Host-only: no nvcc needed.
//
// Out of memory throws arcpool::out_of_memory, a std::bad_alloc, not RMM's rmm::out_of_memory:
// under RMM's failure_callback_resource_adaptor, name it as the adaptor's exception type
// (failure_callback_resource_adaptor<Upstream, arcpool::out_of_memory>), or its callback (a
// spill, say) never runs.
#pragma once

#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>

#include "arcpool/arcpool.hpp"

namespace arcpool {

/// A CCCL memory resource allocating from one arcpool allocator (borrowed: it must outlive the
/// resource and every allocation made through it). Copies compare equal when they share the
/// allocator. Pointers it returns are by-pointer allocations (arcpool_allocator_malloc_async).
class memory_resource {
 public:
  explicit memory_resource(arcpool_allocator_t* allocator) noexcept : allocator_(allocator) {}

  /// Stream-ordered: usable by work queued on `stream` after the call. Never blocks (except
  /// when out of memory). Throws out_of_memory / error.
  void* allocate_async(size_t bytes, size_t alignment, ::cuda::stream_ref stream) {
    void* p = nullptr;
    detail::check(
        arcpool_allocator_malloc_async(allocator_, bytes, alignment, to_stream(stream), &p));
    return p;
  }

  /// Stream-ordered free after the work queued on `stream`. Never throws; never blocks. A free
  /// arcpool refuses is written to stderr (nothing is freed).
  void deallocate_async(void* p, size_t, size_t, ::cuda::stream_ref stream) noexcept {
    detail::report_failed_free(arcpool_allocator_free_async(allocator_, p, to_stream(stream)), p);
  }

  /// Synchronous form: allocates on the legacy default stream and waits for it. Blocks.
  void* allocate(size_t bytes, size_t alignment) {
    void* p = allocate_async(bytes, alignment, ::cuda::stream_ref{cudaStream_t{}});
    if (const arcpool_status_t status = arcpool_stream_synchronize(allocator_, nullptr);
        status != ARCPOOL_STATUS_SUCCESS) {
      arcpool_allocator_free_async(allocator_, p, nullptr);  // nothing leaks
      detail::throw_status(status);
    }
    return p;
  }

  /// Synchronous form: frees on the legacy default stream after its work, and waits for that
  /// stream. Memory used on another stream is freed once that stream's work completed too
  /// (arcpool's routing), which this does not wait for.
  void deallocate(void* p, size_t bytes, size_t alignment) noexcept {
    deallocate_async(p, bytes, alignment, ::cuda::stream_ref{cudaStream_t{}});
    arcpool_stream_synchronize(allocator_, nullptr);
  }

  /// CCCL 3.5's stream-first form of allocate_async.
  void* allocate(::cuda::stream_ref stream, size_t bytes, size_t alignment) {
    return allocate_async(bytes, alignment, stream);
  }

  /// CCCL 3.5's stream-first form of deallocate_async.
  void deallocate(::cuda::stream_ref stream, void* p, size_t bytes, size_t alignment) noexcept {
    deallocate_async(p, bytes, alignment, stream);
  }

  /// CCCL 3.5's name of the synchronous allocate. Blocks.
  void* allocate_sync(size_t bytes, size_t alignment) { return allocate(bytes, alignment); }

  /// CCCL 3.5's name of the synchronous deallocate. Blocks.
  void deallocate_sync(void* p, size_t bytes, size_t alignment) noexcept {
    deallocate(p, bytes, alignment);
  }

  bool operator==(const memory_resource& other) const noexcept {
    return allocator_ == other.allocator_;
  }
  bool operator!=(const memory_resource& other) const noexcept { return !(*this == other); }

  /// The memory is device memory.
  friend void get_property(const memory_resource&, ::cuda::mr::device_accessible) noexcept {}

  /// The allocator (borrowed).
  arcpool_allocator_t* allocator() const noexcept { return allocator_; }

 private:
  static arcpool_stream_t to_stream(::cuda::stream_ref s) noexcept {
    return reinterpret_cast<arcpool_stream_t>(s.get());
  }

  arcpool_allocator_t* allocator_;
};

#if CCCL_MAJOR_VERSION < 3 || (CCCL_MAJOR_VERSION == 3 && CCCL_MINOR_VERSION == 0)
static_assert(::cuda::mr::async_resource_with<memory_resource, ::cuda::mr::device_accessible>,
              "arcpool::memory_resource must satisfy CCCL 2.x's and 3.0's async_resource concept");
#else
static_assert(::cuda::mr::resource_with<memory_resource, ::cuda::mr::device_accessible>,
              "arcpool::memory_resource must satisfy CCCL's stream-first resource concept");
static_assert(::cuda::mr::synchronous_resource_with<memory_resource, ::cuda::mr::device_accessible>,
              "arcpool::memory_resource must satisfy CCCL's synchronous_resource concept");
#endif

/// A Thrust allocator taking temporaries from arcpool on one stream:
///   thrust::sort(thrust::cuda::par_nosync(arcpool::thrust_allocator(alloc, s)).on(s), ...)
/// Allocations and frees are stream-ordered on `stream`, the stream the algorithm runs on.
class thrust_allocator {
 public:
  using value_type = char;

  thrust_allocator(arcpool_allocator_t* allocator, arcpool_stream_t stream) noexcept
      : allocator_(allocator), stream_(stream) {}

  /// Never blocks (except when out of memory). Throws out_of_memory.
  char* allocate(std::ptrdiff_t bytes) {
    void* p = nullptr;
    detail::check(
        arcpool_allocator_malloc_async(allocator_, static_cast<size_t>(bytes), 0, stream_, &p));
    return static_cast<char*>(p);
  }

  /// Stream-ordered on the allocator's stream. Never throws: a free arcpool refuses is written
  /// to stderr.
  void deallocate(char* p, size_t) noexcept {
    detail::report_failed_free(arcpool_allocator_free_async(allocator_, p, stream_), p);
  }

  arcpool_stream_t stream() const noexcept { return stream_; }

 private:
  arcpool_allocator_t* allocator_;
  arcpool_stream_t stream_;
};

}  // namespace arcpool
