// libarcpool_torch: the exact signatures PyTorch's CUDAPluggableAllocator calls, plus the hooks
// it accepts as function pointers (record-stream, empty-cache, memory-fraction, and the CUDA
// graph pool hooks, whose parameters are C++ types), served by arcpool's per-device default
// allocators. Loaded by arcpool.torch.install().
//
// A failure PyTorch must see (out of memory; an allocation on a capturing stream arcpool cannot
// serve) is thrown as std::runtime_error carrying arcpool's message: PyTorch calls these
// through std::function, and its Python binding turns the exception into a RuntimeError with
// that message, never a mysterious out-of-memory. The functions arcpool.torch calls through
// ctypes return a status instead: an exception must not cross ctypes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

void mark_used(int device) {
  if (device >= 0 && device < kMaxDevices && !g_used[device].load(std::memory_order_relaxed)) {
    g_used[device].store(true, std::memory_order_relaxed);
  }
}

/// PyTorch's c10::cuda::MempoolId_t (c10/cuda/CUDAGraphsC10Utils.h): a pair of CaptureId_t,
/// which is unsigned long long.
using torch_mempool_id = std::pair<unsigned long long, unsigned long long>;

/// What PyTorch's CUDAGraph hands beginAllocateToPool: true for a stream that captures into
/// that graph now (it asks cudaStreamGetCaptureInfo).
using torch_stream_filter = std::function<bool(cudaStream_t)>;

/// A capture bound to a graph pool: its id, and the stream its binding was begun on.
struct bound_capture {
  unsigned long long id;
  cudaStream_t stream;
};

/// One of PyTorch's private memory pools, served by an arcpool graph pool (docs/graphs.md,
/// "PyTorch's graph pools").
struct torch_pool {
  int device;
  torch_mempool_id id;
  arcpool_graph_pool_t* pool;
  long uses;  ///< begin hooks its release hooks have not matched
  /// The capture recording to the pool, between its begin and end hooks (empty: none; one at a
  /// time, as PyTorch's own allocator allows).
  torch_stream_filter filter;
  std::vector<bound_capture> bound;  ///< captures `pool` is bound to
};

/// PyTorch's pools with an arcpool graph pool. Few (one per graph, or per shared pool) and
/// touched at a capture's begin and end, and by an allocation while a capture is open.
std::mutex g_pools_mutex;
std::vector<torch_pool> g_pools;
/// Captures between their begin and end hooks: while there are none, an allocation pays one
/// load for all this.
std::atomic<int> g_open_captures{0};
/// The streams arcpool.torch registered for their captures (arcpool_torch_capture_stream_begin),
/// with their devices, under g_pools_mutex: a capture is bound to its graph pool on one of them,
/// also when its first allocation is on a stream it forked to.
std::vector<std::pair<int, cudaStream_t>> g_capture_streams;

/// Whether `stream` captures now, and the capture's id; throws if the query fails.
bool capture_of(cudaStream_t stream, unsigned long long* capture) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (const cudaError_t e = cudaStreamGetCaptureInfo(stream, &status, capture); e != cudaSuccess) {
    throw std::runtime_error(std::string("arcpool: cudaStreamGetCaptureInfo failed: ") +
                             cudaGetErrorName(e));
  }
  return status == cudaStreamCaptureStatusActive;
}

/// The stream to bind `capture` on: a registered capture stream of `device` in that capture
/// (arcpool binds a capture only on a stream it knows), else `stream` itself.
cudaStream_t binding_stream(int device, cudaStream_t stream, unsigned long long capture) {
  for (const auto& [d, known] : g_capture_streams) {
    unsigned long long theirs = 0;
    if (d == device && capture_of(known, &theirs) && theirs == capture) return known;
  }
  return stream;
}

torch_pool* find_pool(int device, const torch_mempool_id& id) {
  for (torch_pool& p : g_pools) {
    if (p.device == device && p.id == id) return &p;
  }
  return nullptr;
}

/// When `stream` captures, binds its capture, once, to the graph pool of the open capture whose
/// filter claims `stream`, before the capture's first allocation there: PyTorch calls the begin
/// hook before cudaStreamBeginCapture, when there is no capture to bind yet. A stream that does
/// not capture is left alone (torch.cuda.use_mem_pool's filter claims those too: graph pools
/// lend only to captures).
void bind_capture(int device, cudaStream_t stream) {
  unsigned long long capture = 0;
  if (!capture_of(stream, &capture)) return;
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  for (torch_pool& p : g_pools) {
    if (p.device != device || !p.filter) continue;
    if (std::any_of(p.bound.begin(), p.bound.end(),
                    [capture](const bound_capture& b) { return b.id == capture; })) {
      return;
    }
    if (!p.filter(stream)) continue;
    // A side stream the capture forked to may allocate first: bind on the capture's own
    // stream, which arcpool knows; arcpool then serves the side stream from the pool too.
    const cudaStream_t on = binding_stream(device, stream, capture);
    if (arcpool_graph_pool_begin(p.pool, reinterpret_cast<arcpool_stream_t>(on)) !=
        ARCPOOL_STATUS_SUCCESS) {
      raise("binding the capture to its graph pool failed");
    }
    p.bound.push_back(bound_capture{capture, on});
    return;
  }
}

/// Unbinds the captures of `p` whose streams its open capture, if any, does not claim.
void unbind_ended(torch_pool& p) {
  for (auto it = p.bound.begin(); it != p.bound.end();) {
    const cudaStream_t s = it->stream;
    if (p.filter && p.filter(s)) {
      ++it;
      continue;
    }
    if (arcpool_graph_pool_end(p.pool, reinterpret_cast<arcpool_stream_t>(s)) !=
        ARCPOOL_STATUS_SUCCESS) {
      raise("unbinding the capture from its graph pool failed");
    }
    it = p.bound.erase(it);
  }
}

/// A free PyTorch handed over that arcpool refused with UNSUPPORTED: a stream recorded for the
/// memory (record_stream) captures a graph, where no fence can be taken. PyTorch's own
/// allocator defers such a free until no capture is under way
/// (needs_events_deferred_until_no_capture); the free hook cannot refuse, and PyTorch forgets
/// the pointer, so the shim keeps it (arcpool's entry for it stays, nothing was freed) and
/// makes the free again after a capture's end, and at empty_cache.
struct refused_free {
  void* ptr;
  size_t size;
  int device;
  cudaStream_t stream;
};
std::mutex g_refused_mutex;
std::vector<refused_free> g_refused;  // under g_refused_mutex

/// Frees `f`; a refusal for a capture keeps it for later, any other failure is reported.
void free_or_keep(const refused_free& f) {
  const arcpool_status_t status =
      arcpool_free_async(f.ptr, f.size, f.device, reinterpret_cast<arcpool_stream_t>(f.stream));
  if (status == ARCPOOL_STATUS_SUCCESS) return;
  if (status == ARCPOOL_STATUS_UNSUPPORTED) {
    try {
      std::lock_guard<std::mutex> lock(g_refused_mutex);
      g_refused.push_back(f);
      return;
    } catch (const std::exception&) {  // no host memory to keep it: reported below
    }
  }
  std::fprintf(stderr, "arcpool: free of %p failed: %s\n", f.ptr, arcpool_last_error());
}

/// Makes the refused frees again (a capture ended): each is freed, or kept once more.
void retry_refused_frees() {
  std::vector<refused_free> refused;
  {
    std::lock_guard<std::mutex> lock(g_refused_mutex);
    refused.swap(g_refused);
  }
  for (const refused_free& f : refused)
    free_or_keep(f);
}

}  // namespace

/// PyTorch's alloc: void* (size_t size, int device, cudaStream_t stream).
ARCPOOL_TORCH_API void* arcpool_torch_malloc(size_t size, int device, cudaStream_t stream) {
  if (size == 0) return nullptr;
  if (g_open_captures.load(std::memory_order_acquire) != 0) bind_capture(device, stream);
  void* p = arcpool_malloc_async(size, device, reinterpret_cast<arcpool_stream_t>(stream));
  if (p == nullptr) raise("allocation failed");
  mark_used(device);
  return p;
}

/// PyTorch's free: void (void* ptr, size_t size, int device, cudaStream_t stream); the stream
/// is the one the block was allocated on. Never throws.
ARCPOOL_TORCH_API void arcpool_torch_free(void* ptr, size_t size, int device, cudaStream_t stream) {
  free_or_keep({ptr, size, device, stream});
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
  retry_refused_frees();
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

/// PyTorch's beginAllocateToPool (torch.cuda.graph's capture_begin, before
/// cudaStreamBeginCapture): the allocations of the capture that `filter` claims come from the
/// arcpool graph pool serving PyTorch's pool `id`, made at its first begin. PyTorch counts a
/// pool's uses the same way: each begin is matched by one release_pool. One capture at a time
/// records to a pool, as PyTorch's own allocator requires (c10/cuda/CUDACachingAllocator.cpp,
/// beginAllocateToPool: "already recording to mempool_id"): a second begin is refused, and
/// changes nothing (an end names only the pool, so two open captures could not be told apart).
ARCPOOL_TORCH_API void arcpool_torch_begin_allocate_to_pool(int device, torch_mempool_id id,
                                                            torch_stream_filter filter) {
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  torch_pool* p = find_pool(device, id);
  if (p != nullptr && p->filter) {
    throw std::runtime_error("arcpool: beginAllocateToPool: already recording to mempool_id (" +
                             std::to_string(id.first) + ", " + std::to_string(id.second) + ")");
  }
  if (p == nullptr) {
    arcpool_allocator_t* a = nullptr;
    arcpool_graph_pool_t* pool = nullptr;
    if (arcpool_default_allocator_get(device, &a) != ARCPOOL_STATUS_SUCCESS ||
        arcpool_graph_pool_create(a, &pool) != ARCPOOL_STATUS_SUCCESS) {
      raise("creating a graph pool failed");
    }
    mark_used(device);
    g_pools.push_back(torch_pool{device, id, pool, 0, {}, {}});
    p = &g_pools.back();
  }
  ++p->uses;
  p->filter = std::move(filter);
  g_open_captures.fetch_add(1, std::memory_order_release);
}

/// PyTorch's endAllocateToPool (capture_end, after cudaStreamEndCapture): the capture recording
/// to pool `id` stops allocating from it, and its streams are unbound.
ARCPOOL_TORCH_API void arcpool_torch_end_allocate_to_pool(int device, torch_mempool_id id) {
  {
    std::lock_guard<std::mutex> lock(g_pools_mutex);
    torch_pool* p = find_pool(device, id);
    if (p == nullptr || !p->filter) return;
    p->filter = nullptr;
    g_open_captures.fetch_sub(1, std::memory_order_release);
    unbind_ended(*p);
  }
  retry_refused_frees();  // the capture ended: a free it held back may be made now
}

/// PyTorch's releasePool (a graph's reset or destruction, a MemPool's end): the last release of
/// pool `id` releases the arcpool graph pool, whose memory goes back to the allocator once
/// every graph bound to it is destroyed and every block lent from it deallocated.
ARCPOOL_TORCH_API void arcpool_torch_release_pool(int device, torch_mempool_id id) {
  arcpool_graph_pool_t* released = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_pools_mutex);
    torch_pool* p = find_pool(device, id);
    if (p == nullptr || --p->uses > 0) return;
    if (p->filter) g_open_captures.fetch_sub(1, std::memory_order_release);
    p->filter = nullptr;
    unbind_ended(*p);
    released = p->pool;
    g_pools.erase(g_pools.begin() + (p - g_pools.data()));
  }
  arcpool_graph_pool_release(released);
}

/// Called by arcpool.torch before PyTorch's CUDAGraph.capture_begin, with the stream it will
/// capture on (torch's current stream): registers it with the device's allocator until
/// arcpool_torch_capture_stream_end. arcpool acts on a capturing stream only if it created or
/// registered it (docs/graphs.md). Returns arcpool's status (ctypes).
ARCPOOL_TORCH_API arcpool_status_t arcpool_torch_capture_stream_begin(int device,
                                                                      cudaStream_t stream) {
  arcpool_allocator_t* a = nullptr;
  const arcpool_status_t status = arcpool_default_allocator_get(device, &a);
  if (status != ARCPOOL_STATUS_SUCCESS) return status;
  mark_used(device);
  const arcpool_status_t registered =
      arcpool_stream_register(a, reinterpret_cast<arcpool_stream_t>(stream));
  if (registered == ARCPOOL_STATUS_SUCCESS) {
    std::lock_guard<std::mutex> lock(g_pools_mutex);
    g_capture_streams.emplace_back(device, stream);
  }
  return registered;
}

/// Called by arcpool.torch after PyTorch's CUDAGraph.capture_end (or a failed capture_begin):
/// withdraws the registration arcpool_torch_capture_stream_begin made. Returns arcpool's
/// status (ctypes): UNSUPPORTED while the stream still captures (a capture_end PyTorch refused),
/// the stream then staying a registered capture stream until a later call.
ARCPOOL_TORCH_API arcpool_status_t arcpool_torch_capture_stream_end(int device,
                                                                    cudaStream_t stream) {
  arcpool_allocator_t* a = nullptr;
  arcpool_status_t status = arcpool_default_allocator_get(device, &a);
  if (status == ARCPOOL_STATUS_SUCCESS) {
    status = arcpool_stream_unregister(a, reinterpret_cast<arcpool_stream_t>(stream));
    if (status == ARCPOOL_STATUS_UNSUPPORTED) return status;  // capturing: registered still
  }
  std::lock_guard<std::mutex> lock(g_pools_mutex);
  const auto it =
      std::find(g_capture_streams.begin(), g_capture_streams.end(), std::make_pair(device, stream));
  if (it != g_capture_streams.end()) g_capture_streams.erase(it);
  return status;
}
