// libarcpool_torch: the exact C signatures PyTorch's CUDAPluggableAllocator calls, plus the
// hooks it accepts as C function pointers (record-stream, empty-cache, memory-fraction),
// served by arcpool's per-device default allocators. Loaded by arcpool.torch.install().
//
// A failure PyTorch must see (out of memory; a stream capturing a CUDA graph, which arcpool
// does not support yet) is thrown as std::runtime_error carrying arcpool's message: PyTorch
// calls these through std::function, and its Python binding turns the exception into a
// RuntimeError with that message, never a mysterious out-of-memory.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "arcpool/arcpool.h"

#define ARCPOOL_TORCH_API extern "C" __attribute__((visibility("default")))

namespace {

[[noreturn]] void raise(const char* what) {
  throw std::runtime_error(std::string("arcpool: ") + what + ": " + arcpool_last_error());
}

/// Devices this shim allocated on (empty_cache trims only those: asking for another device's
/// default allocator would create it, and a CUDA context with it).
constexpr int kMaxDevices = 64;
std::atomic<bool> g_used[kMaxDevices] = {};

/// The fraction set_memory_fraction was last given per device, once given (1.0 before), for
/// torch.cuda.get_per_process_memory_fraction, which a pluggable allocator cannot answer.
std::atomic<double> g_fraction[kMaxDevices];
std::atomic<bool> g_fraction_set[kMaxDevices] = {};

}  // namespace

/// PyTorch's alloc: void* (size_t size, int device, cudaStream_t stream).
ARCPOOL_TORCH_API void* arcpool_torch_malloc(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  void* p = arcpool_malloc_async(size, device, reinterpret_cast<arcpool_stream_t>(stream));
  if (p == nullptr) raise("allocation failed");
  if (device >= 0 && device < kMaxDevices && !g_used[device].load(std::memory_order_relaxed)) {
    g_used[device].store(true, std::memory_order_relaxed);
  }
  return p;
}

/// PyTorch's free: void (void* ptr, size_t size, int device, cudaStream_t stream); the stream
/// is the one the block was allocated on. Never throws.
ARCPOOL_TORCH_API void arcpool_torch_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  if (arcpool_free_async(ptr, size, device, reinterpret_cast<arcpool_stream_t>(stream)) !=
      ARCPOOL_STATUS_SUCCESS) {
    std::fprintf(stderr, "arcpool: free of %p failed: %s\n", ptr, arcpool_last_error());
  }
}

/// Tensor.record_stream: the free waits for `stream`'s work queued up to the free, not only up
/// to this call, as PyTorch promises. PyTorch's own allocator assumes the stream outlives the
/// tensor's deallocation; arcpool takes the same guarantee from the flag (its streams cannot
/// be registered: the shim cannot tell torch's pool streams from ExternalStreams users
/// destroy). As PyTorch's allocator, it does nothing for an empty tensor (null) or for memory
/// another allocator made (CUDA IPC, DLPack, from_blob): those frees are not arcpool's to order.
ARCPOOL_TORCH_API void arcpool_torch_record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;
  const arcpool_status_t status =
      arcpool_record_stream_with_flags(ptr, reinterpret_cast<arcpool_stream_t>(stream),
                                       ARCPOOL_RECORD_USE_FLAG_STREAM_OUTLIVES_DEALLOCATION);
  if (status != ARCPOOL_STATUS_SUCCESS && status != ARCPOOL_STATUS_UNKNOWN_POINTER) {
    raise("record_stream failed");
  }
}

/// torch.cuda.empty_cache: for every device this shim allocated on, synchronize the device,
/// then flush the caches, complete pending frees and trim the pool, as PyTorch's
/// cudaMallocAsync backend does (cudaDeviceSynchronize, then cudaMemPoolTrimTo). torch's
/// streams are not arcpool's (the shim cannot register them), and cudaMemPoolTrimTo keeps
/// "allocations that have been asynchronously freed but whose completion has not been observed
/// on the host": without the device synchronization, memory freed on them would stay reserved.
/// A failure is thrown, as PyTorch's backend raises one (C10_CUDA_CHECK): the synchronization
/// fails, and invalidates the capture, while a stream of the device captures a graph.
ARCPOOL_TORCH_API void arcpool_torch_empty_cache() {
  for (int d = 0; d < kMaxDevices; ++d) {
    if (!g_used[d].load(std::memory_order_relaxed)) continue;
    arcpool_allocator_t* a = nullptr;
    if (arcpool_default_allocator_get(d, &a) != ARCPOOL_STATUS_SUCCESS ||
        arcpool_allocator_synchronize_device(a) != ARCPOOL_STATUS_SUCCESS ||
        arcpool_allocator_trim(a, 0) != ARCPOOL_STATUS_SUCCESS) {
      raise("empty_cache failed");
    }
  }
}

/// torch.cuda.set_per_process_memory_fraction: a hard limit enforced by arcpool's counter.
/// PyTorch takes any fraction in [0, 1]; one that rounds to 0 bytes allows no new pool memory,
/// as with PyTorch's own allocator (arcpool's hard limit 0 means no limit, so it becomes 1 byte).
ARCPOOL_TORCH_API void arcpool_torch_set_memory_fraction(double fraction, int device) {
  arcpool_allocator_t* a = nullptr;
  size_t total = 0;
  if (arcpool_default_allocator_get(device, &a) != ARCPOOL_STATUS_SUCCESS ||
      arcpool_allocator_device_memory(a, &total) != ARCPOOL_STATUS_SUCCESS) {
    raise("set_memory_fraction failed");
  }
  const auto limit = static_cast<size_t>(fraction * static_cast<double>(total));
  arcpool_allocator_set_hard_limit(a, limit == 0 ? 1 : limit);
  if (device >= 0 && device < kMaxDevices) {
    g_fraction[device].store(fraction);
    g_fraction_set[device].store(true);
  }
}

/// The fraction torch.cuda.set_per_process_memory_fraction last gave `device` (1.0 before, as
/// PyTorch's own allocator answers), for arcpool.torch.get_per_process_memory_fraction.
ARCPOOL_TORCH_API double arcpool_torch_memory_fraction(int device) {
  if (device < 0 || device >= kMaxDevices || !g_fraction_set[device].load()) return 1.0;
  return g_fraction[device].load();
}
