// Device memory the host cannot touch, stream-ordered pools with CUDA's reuse rules, the access
// race checker, and the memory entry points.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "state.hpp"

namespace simcuda {
namespace {

constexpr size_t kChunk = size_t{2} << 20;  // a pool's reservation granularity
constexpr size_t kAlign = 512;              // allocations start at 512-byte boundaries

size_t round_up(size_t v, size_t to) {
  return (v + to - 1) / to * to;
}

/// Reserves `bytes` of device `d`'s memory (first fit); 0 when full.
uintptr_t reserve(device_obj& d, size_t bytes) {
  for (auto it = d.free_ranges.begin(); it != d.free_ranges.end(); ++it) {
    if (it->second < bytes) continue;
    const size_t offset = it->first;
    const size_t left = it->second - bytes;
    d.free_ranges.erase(it);
    if (left > 0) d.free_ranges.emplace(offset + bytes, left);
    d.reserved += bytes;
    return d.base + offset;
  }
  return 0;
}

/// Gives [p, p + bytes) back to the device and drops its pages.
void release(device_obj& d, uintptr_t p, size_t bytes) {
  size_t offset = p - d.base;
  d.reserved -= bytes;
  fallocate(d.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
            static_cast<off_t>(bytes));
  auto next = d.free_ranges.lower_bound(offset);
  if (next != d.free_ranges.end() && offset + bytes == next->first) {
    bytes += next->second;
    next = d.free_ranges.erase(next);
  }
  if (next != d.free_ranges.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  d.free_ranges.emplace(offset, bytes);
}

device_obj* device_of(uintptr_t p) {
  for (auto& d : rt().devices)
    if (d->base != 0 && p >= d->base && p < d->base + d->capacity) return d.get();
  return nullptr;
}

bool pinned(uintptr_t p, size_t bytes) {
  auto& m = rt().pinned;
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second;
}

pool_obj* make_pool(device_obj& d) {
  auto p = std::make_unique<pool_obj>();
  p->handle = new_handle();
  p->device = d.ordinal;
  pool_obj* raw = p.get();
  rt().pools.emplace(raw->handle, std::move(p));
  return raw;
}

pool_obj* resolve_pool(cudaMemPool_t handle, const char* call) {
  auto it = rt().pools.find(reinterpret_cast<uintptr_t>(handle));
  if (it == rt().pools.end()) {
    violation(format("%s: %p is not a memory pool", call, static_cast<void*>(handle)));
    return nullptr;
  }
  if (it->second->destroyed) {
    violation(format("%s: use of destroyed memory pool %p", call, static_cast<void*>(handle)));
    return nullptr;
  }
  return it->second.get();
}

chunk* chunk_of(pool_obj& pool, uintptr_t p) {
  for (chunk& c : pool.chunks)
    if (p >= c.base && p < c.base + c.bytes) return &c;
  return nullptr;
}

/// Releases the pool's chunks that hold nothing outstanding until reserved <= keep. A free
/// counts as outstanding until the host observed it (cudaMemPoolTrimTo's note).
void trim(pool_obj& pool, uint64_t keep) {
  runtime& r = rt();
  device_obj& d = *r.devices[pool.device];
  for (size_t i = pool.chunks.size(); i-- > 0 && pool.reserved > keep;) {
    chunk& c = pool.chunks[i];
    if (c.live > 0) continue;
    const auto in_chunk = [&](const free_block& b) {
      return b.base >= c.base && b.base < c.base + c.bytes;
    };
    const bool observed =
        std::all_of(pool.free_blocks.begin(), pool.free_blocks.end(), [&](const free_block& b) {
          return !in_chunk(b) || r.host_clock.get(b.stream->id) >= b.seq;
        });
    if (!observed) continue;
    pool.free_blocks.erase(
        std::remove_if(pool.free_blocks.begin(), pool.free_blocks.end(), in_chunk),
        pool.free_blocks.end());
    release(d, c.base, c.bytes);
    pool.reserved -= c.bytes;
    pool.chunks.erase(pool.chunks.begin() + static_cast<long>(i));
  }
}

cudaError_t pool_allocate(pool_obj& pool, size_t bytes, stream_obj& s, const char* call,
                          void** out) {
  runtime& r = rt();
  device_obj& d = *r.devices[pool.device];
  if (r.cfg.oom_after_allocations >= 0 && r.allocations++ >= r.cfg.oom_after_allocations) {
    return cudaErrorMemoryAllocation;
  }
  const size_t size = round_up(std::max<size_t>(bytes, 1), kAlign);
  // The reuse rules (driver_types.h, cudaMemPoolAttr). The stream-ordered allocator may reuse
  // memory freed on the same stream; ReuseFollowEventDependencies: "Allow cuMemAllocAsync to
  // use memory asynchronously freed in another streams as long as a stream ordering dependency
  // of the allocating stream on the free action exists."; ReuseAllowOpportunistic: "Allow
  // reuse of already completed frees when there is no dependency between the free and
  // allocation."; ReuseAllowInternalDependencies: "Allow cuMemAllocAsync to insert new stream
  // dependencies in order to establish the stream ordering required to reuse a piece of memory
  // released by cuFreeAsync". Adversarially, the most recently freed block that any rule
  // allows is handed out.
  int best = -1;
  bool best_needs_wait = false;
  for (size_t i = 0; i < pool.free_blocks.size(); ++i) {
    const free_block& b = pool.free_blocks[i];
    if (b.bytes < size || b.bytes > 2 * size) continue;
    const bool ordered = b.stream == &s || (pool.follow_event_dependencies != 0 &&
                                            s.clock.get(b.stream->id) >= b.seq);
    const bool allowed =
        ordered || (pool.allow_opportunistic != 0 && b.done) || pool.allow_internal_dependencies;
    if (!allowed) continue;
    if (best < 0 || b.order > pool.free_blocks[best].order) {
      best = static_cast<int>(i);
      best_needs_wait = !ordered && !(pool.allow_opportunistic != 0 && b.done);
    }
  }
  auto o = std::make_unique<op>();
  o->what = call;
  uintptr_t base = 0;
  size_t block = size;
  if (best >= 0) {
    const free_block b = pool.free_blocks[best];
    pool.free_blocks.erase(pool.free_blocks.begin() + best);
    base = b.base;
    block = b.bytes;
    if (best_needs_wait) {
      o->after.push_back({b.stream, b.seq});
      s.clock.raise(b.stream->id, b.seq);
      ++r.hidden_waits;
    }
    chunk_of(pool, base)->live++;
  } else {
    chunk* room = nullptr;
    for (chunk& c : pool.chunks)
      if (c.bytes - c.carved >= size) room = &c;
    if (room == nullptr) {
      const size_t grow = round_up(size, kChunk);
      const size_t limit = pool.max_size != 0 ? pool.max_size : d.capacity;
      const uintptr_t p = pool.reserved + grow <= limit ? reserve(d, grow) : 0;
      if (p == 0) return cudaErrorMemoryAllocation;
      pool.chunks.push_back({p, grow, 0, 0});
      pool.reserved += grow;
      pool.reserved_high = std::max(pool.reserved_high, pool.reserved);
      room = &pool.chunks.back();
    }
    base = room->base + room->carved;
    room->carved += size;
    room->live++;
  }
  pool.used += block;
  pool.used_high = std::max(pool.used_high, pool.used);
  const uint64_t seq = enqueue(s, std::move(o));
  auto a = std::make_unique<allocation>();
  a->base = base;
  a->bytes = block;
  a->pool = &pool;
  a->alloc = {&s, seq};
  a->alloc_what = format("%s on %s", call, s.name().c_str());
  r.freed.erase(base);
  r.live[base] = std::move(a);
  *out = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

}  // namespace

bool is_device_address(uintptr_t p) {
  return device_of(p) != nullptr || import_region_of(p) != nullptr;
}

void* alias_of(uintptr_t p) {
  if (device_obj* d = device_of(p)) return reinterpret_cast<void*>(d->alias + (p - d->base));
  if (const import_region* region = import_region_of(p)) {
    return reinterpret_cast<void*>(region->alias + (p - region->base));
  }
  return reinterpret_cast<void*>(p);
}

allocation* find_live(uintptr_t p, size_t bytes) {
  auto& live = rt().live;
  auto it = live.upper_bound(p);
  if (it == live.begin()) return nullptr;
  --it;
  allocation& a = *it->second;
  return p >= a.base && p + bytes <= a.base + a.bytes ? &a : nullptr;
}

void check_access(stream_obj& s, uint64_t seq, uintptr_t p, size_t bytes, bool host_ok,
                  const std::string& what, bool write) {
  if (bytes == 0) return;
  const std::string who = format("%s on %s", what.c_str(), s.name().c_str());
  if (!is_device_address(p)) {
    if (!host_ok && !pinned(p, bytes)) {
      violation(format("%s touches host memory 0x%llx that is not page-locked", who.c_str(),
                       static_cast<unsigned long long>(p)));
    }
    return;
  }
  allocation* a = find_live(p, bytes);
  if (a == nullptr) {
    auto& freed = rt().freed;
    auto it = freed.upper_bound(p);
    if (it != freed.begin() && p < std::prev(it)->first + std::prev(it)->second->bytes) {
      const allocation& f = *std::prev(it)->second;
      violation(format("use after free: %s touches [0x%llx, +%zu) after %s freed it", who.c_str(),
                       static_cast<unsigned long long>(p), bytes, f.free_what.c_str()));
    } else {
      violation(format("%s touches [0x%llx, +%zu), which is not allocated", who.c_str(),
                       static_cast<unsigned long long>(p), bytes));
    }
    return;
  }
  if (a->alloc.stream != nullptr && s.clock.get(a->alloc.stream->id) < a->alloc.seq) {
    violation(format("use before allocation: %s is not ordered after %s", who.c_str(),
                     a->alloc_what.c_str()));
  }
  // cudaMemPoolSetAccess "Controls visibility of pools between devices": a pool's memory is
  // reached from its own device, and from another only once the pool granted that device
  // access (the programming guide's stream-ordered allocator chapter: peer access enabled with
  // cudaDeviceEnablePeerAccess does not extend to pools).
  if (a->pool != nullptr && s.device != a->pool->device &&
      std::find(a->pool->peers.begin(), a->pool->peers.end(), s.device) == a->pool->peers.end()) {
    violation(
        format("%s: device %d has no access to this memory of device %d's pool "
               "(cudaMemPoolSetAccess)",
               who.c_str(), s.device, a->pool->device));
  }
  // Two writes of one allocation on different streams, neither ordered before the other, may
  // run at the same time: a data race (compute-sanitizer's racecheck finds it in shared memory
  // only; simcuda checks it for explicit writes: memsets and copy destinations).
  if (write) {
    for (const auto& [stream_id, w] : a->writes) {
      if (stream_id != s.id && s.clock.get(stream_id) < w.seq) {
        violation(
            format("write-write race: %s is not ordered after %s", who.c_str(), w.what.c_str()));
      }
    }
    a->writes[s.id] = {seq, who};
  }
  a->accesses[s.id] = {seq, who};
}

void apply_release_thresholds(device_obj& d) {
  for (auto& [handle, pool] : rt().pools)
    if (pool->device == d.ordinal && pool->reserved > pool->release_threshold) {
      trim(*pool, pool->release_threshold);
    }
}

void init_device_memory(device_obj& d) {
  const std::string name = format("simcuda-device-%d", d.ordinal);
  d.fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  if (d.fd < 0 || ftruncate(d.fd, static_cast<off_t>(d.capacity + ipc_table_bytes())) != 0) {
    std::perror("simcuda: memfd for device memory");
    std::abort();
  }
  // Device memory the host cannot touch: the device addresses map the memory with no access,
  // so a host dereference faults as it would on a GPU; simulated work uses a private alias.
  void* base = mmap(nullptr, d.capacity, PROT_NONE, MAP_SHARED | MAP_NORESERVE, d.fd, 0);
  void* alias =
      mmap(nullptr, d.capacity, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, d.fd, 0);
  if (base == MAP_FAILED || alias == MAP_FAILED) {
    std::perror("simcuda: mmap of device memory");
    std::abort();
  }
  d.base = reinterpret_cast<uintptr_t>(base);
  d.alias = reinterpret_cast<uintptr_t>(alias);
  init_ipc_table(d);
  d.free_ranges.emplace(0, d.capacity);
  d.default_pool = make_pool(d);
  d.default_pool->is_default = true;
  d.current_pool = d.default_pool;
}

/// Checks that every recorded access of `a` and its allocation are ordered before its free
/// `who` on `s` (enqueued already), and moves it to the freed allocations.
void check_and_retire(allocation& a, stream_obj& s, uint64_t seq, const std::string& who) {
  runtime& r = rt();
  // cudaFreeAsync: "The allocation must not be accessed after stream execution reaches the
  // free." An access not ordered before the free may run after it.
  for (const auto& [stream_id, access] : a.accesses) {
    if (s.clock.get(stream_id) < access.seq) {
      violation(
          format("use after free: %s is not ordered before %s", access.what.c_str(), who.c_str()));
    }
  }
  if (a.alloc.stream != nullptr && s.clock.get(a.alloc.stream->id) < a.alloc.seq) {
    violation(format("%s is not ordered after %s", who.c_str(), a.alloc_what.c_str()));
  }
  a.freed = true;
  a.free_point = {&s, seq};
  a.free_what = who;
  auto node = r.live.extract(a.base);
  r.freed[node.key()] = std::move(node.mapped());
}

/// Frees `a` in stream order on `s` (with the lock): checks that every recorded access and
/// the allocation are ordered before the free, then gives the block to its pool.
void stream_free(allocation& a, stream_obj& s, const char* call) {
  runtime& r = rt();
  auto o = std::make_unique<op>();
  o->what = call;
  pool_obj* pool = a.pool;
  const uintptr_t base = a.base;
  const size_t bytes = a.bytes;
  const std::string who = format("%s on %s", call, s.name().c_str());
  if (pool->imported) {
    // An import is freed in the importing process: the memory stays the exporter's.
    if (const long us = r.cfg.import_free_delay_us; us > 0) {  // a slow importing process
      o->run = [us] { std::this_thread::sleep_for(std::chrono::microseconds(us)); };
    }
    o->complete = [pool, base] { release_import(*pool, base); };
    const uint64_t seq = enqueue(s, std::move(o));
    check_and_retire(a, s, seq, who);
    return;
  }
  const uint64_t order = ++r.free_order;
  o->complete = [pool, base, order, bytes, who] {
    for (free_block& b : pool->free_blocks)
      if (b.base == base && b.order == order) b.done = true;
    pool->used -= bytes;
    if (pool->handle_types != 0) check_no_live_imports(*rt().devices[pool->device], base, who);
  };
  const uint64_t seq = enqueue(s, std::move(o));
  chunk_of(*pool, base)->live--;
  pool->free_blocks.push_back({base, bytes, &s, seq, false, order});
  check_and_retire(a, s, seq, who);
}

graph_memory::~graph_memory() {
  release(*rt().devices[device], base, bytes);
}

std::shared_ptr<graph_memory> reserve_graph_memory(device_obj& d, size_t bytes) {
  const size_t size = round_up(std::max<size_t>(bytes, 1), kAlign);
  const uintptr_t p = reserve(d, size);
  if (p == 0) return nullptr;
  auto m = std::make_shared<graph_memory>();
  m->device = d.ordinal;
  m->base = p;
  m->bytes = size;
  return m;
}

uint64_t graph_free(allocation& a, stream_obj& s, const std::string& what, std::unique_ptr<op> o) {
  if (o == nullptr) o = std::make_unique<op>();
  o->what = what;
  // The memory stays reserved until the free executes: work queued before it may still touch
  // it, even once the graph and its instantiation are destroyed (cuGraphExecDestroy, cuda.h:
  // "If the executable graph is in-flight, it will not be terminated, but rather freed
  // asynchronously on completion").
  o->complete = [held = std::move(a.graph_mem)] { (void)held; };
  const uint64_t seq = enqueue(s, std::move(o));
  if (a.exec != nullptr) {
    auto& unfreed = a.exec->unfreed;
    unfreed.erase(std::remove(unfreed.begin(), unfreed.end(), a.base), unfreed.end());
  }
  check_and_retire(a, s, seq, format("%s on %s", what.c_str(), s.name().c_str()));
  return seq;
}

}  // namespace simcuda

using namespace simcuda;

namespace {

/// cudaMallocAsync on a capturing stream. cudaMallocAsync: "During stream capture, this
/// function results in the creation of an allocation node. In this case, the allocation is
/// owned by the graph instead of the memory pool." cudaGraphAddMemAllocNode: "The allocation's
/// address remains fixed across instantiations and launches."
cudaError_t capture_allocation(stream_obj& s, size_t bytes, const char* call, void** out) {
  cudaError_t e = cudaSuccess;
  graph_node* node = nullptr;
  if (capture_node(s, call, &e, &node); e != cudaSuccess) return e;
  std::shared_ptr<graph_memory> memory = reserve_graph_memory(*rt().devices[s.device], bytes);
  if (memory == nullptr) {
    s.capture->invalidated = true;
    return cudaErrorMemoryAllocation;
  }
  node->type = graph_node::kind::alloc;
  node->address = memory->base;
  node->memory = std::move(memory);
  *out = reinterpret_cast<void*>(node->address);
  return cudaSuccess;
}

/// cudaFreeAsync on a capturing stream: "During stream capture, this function results in the
/// creation of a free node and must therefore be passed the address of a graph allocation."
/// cudaGraphAddMemFreeNode returns cudaErrorInvalidValue for "an allocation twice in the same
/// graph" and "an address that was not returned by an allocation node".
cudaError_t capture_free(stream_obj& s, uintptr_t base) {
  graph_obj& g = *s.capture->graph;
  bool allocated = false, freed = false;
  for (const graph_node& n : g.nodes) {
    allocated = allocated || (n.type == graph_node::kind::alloc && n.address == base);
    freed = freed || (n.type == graph_node::kind::free && n.address == base);
  }
  if (!allocated || freed) {
    violation(format("cudaFreeAsync(0x%llx) on capturing %s: %s",
                     static_cast<unsigned long long>(base), s.name().c_str(),
                     freed ? "the graph frees it already"
                           : "not an allocation of this graph (non-graph memory)"));
    s.capture->invalidated = true;
    return cudaErrorInvalidValue;
  }
  cudaError_t e = cudaSuccess;
  graph_node* node = nullptr;
  if (capture_node(s, "cudaFreeAsync", &e, &node); e != cudaSuccess) return e;
  node->type = graph_node::kind::free;
  node->address = base;
  return cudaSuccess;
}

}  // namespace

bool simcuda::refuse_unsafe_call() {
  if (!unsafe_prohibited()) return false;
  invalidate_prohibiting_captures();
  return true;
}

namespace {

cudaError_t malloc_async(void** out, size_t bytes, cudaMemPool_t handle, cudaStream_t stream,
                         bool ptds, const char* call) {
  SIMCUDA_ENTER(call);
  if (out == nullptr) return ret(cudaErrorInvalidValue);
  stream_obj* s = resolve_stream(stream, ptds, call);
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  pool_obj* pool =
      handle == nullptr ? r.devices[s->device]->current_pool : resolve_pool(handle, call);
  // cudaMemPoolImportFromShareableHandle: "Imported memory pools do not support creating new
  // allocations. As such imported memory pools may not be used in cudaDeviceSetMemPool or
  // cudaMallocFromPoolAsync calls."
  if (pool == nullptr || pool->imported) return ret(cudaErrorInvalidValue);
  if (s->capture != nullptr) {
    // cudaMallocFromPoolAsync: "During stream capture, this function results in the creation
    // of an allocation node. [...] The memory pool's properties are used to set the node's
    // creation parameters." cudaMemAllocNodeParams: "handleTypes must be
    // cudaMemHandleTypeNone. IPC is not supported." (The error code is not documented.)
    if (pool->handle_types != 0) return ret(cudaErrorInvalidValue);
    return ret(capture_allocation(*s, bytes, call, out));
  }
  // Not in the Runtime API's words: on an H200 (CUDA 13.0, driver 580.159.04;
  // bench/results/2026-12-04-h200) an allocation or a free in a pool on a stream that is not
  // capturing, and cudaMemPoolExportPointer, were potentially unsafe calls: refused with
  // cudaErrorStreamCaptureUnsupported while a capture prohibited them, which invalidated it.
  if (refuse_unsafe_call()) return ret(cudaErrorStreamCaptureUnsupported);
  cudaError_t e = cudaSuccess;
  if (capture_node(*s, call, &e)) return ret(e);
  return ret(pool_allocate(*pool, bytes, *s, call, out));
}

cudaError_t free_async(void* p, cudaStream_t stream, bool ptds) {
  SIMCUDA_ENTER("cudaFreeAsync");
  stream_obj* s = resolve_stream(stream, ptds, "cudaFreeAsync");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  const auto base = reinterpret_cast<uintptr_t>(p);
  if (s->capture != nullptr) return ret(capture_free(*s, base));
  if (refuse_unsafe_call()) return ret(cudaErrorStreamCaptureUnsupported);  // see malloc_async
  auto it = r.live.find(base);
  if (it != r.live.end() && it->second->graph_mem != nullptr) {
    // cudaGraphAddMemAllocNode: "Allocations which are not freed in the same graph can be freed
    // by: passing the allocation to cudaMemFreeAsync or cudaMemFree".
    cudaError_t e = cudaSuccess;
    if (capture_node(*s, "cudaFreeAsync", &e)) return ret(e);
    graph_free(*it->second, *s, "cudaFreeAsync");
    return cudaSuccess;
  }
  if (it == r.live.end() || it->second->pool == nullptr) {
    violation(format("cudaFreeAsync(%p) on %s: no pool handed out this pointer%s", p,
                     s->name().c_str(), r.freed.count(base) ? " (freed already)" : ""));
    return ret(cudaErrorInvalidValue);
  }
  cudaError_t e = cudaSuccess;
  if (capture_node(*s, "cudaFreeAsync", &e)) return ret(e);
  stream_free(*it->second, *s, "cudaFreeAsync");
  return cudaSuccess;
}

cudaError_t memcpy_async(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                         cudaStream_t stream, bool ptds, const char* call,
                         std::unique_lock<std::mutex>& lock, bool synchronous) {
  runtime& r = rt();
  stream_obj* s = resolve_stream(stream, ptds, call);
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (dst == nullptr || src == nullptr) return n == 0 ? cudaSuccess : ret(cudaErrorInvalidValue);
  (void)kind;  // cudaMemcpyDefault semantics: the addresses say where they point (UVA)
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto sp = reinterpret_cast<uintptr_t>(src);
  cudaError_t e = cudaSuccess;
  graph_node* node = nullptr;
  if (capture_node(*s, call, &e, &node)) {
    if (node != nullptr) {
      node->run = [d, sp, n] { std::memmove(alias_of(d), alias_of(sp), n); };
      node->touches.push_back({sp, n, true, std::string(call) + " (source)"});
      node->touches.push_back({d, n, true, std::string(call) + " (destination)", true});
    }
    return ret(e);
  }
  auto o = std::make_unique<op>();
  o->what = call;
  void* to = alias_of(d);
  // Programming guide, "API synchronization behavior": a copy from pageable host memory is
  // staged before the call returns; a copy to pageable host memory returns once it completed.
  const bool src_pageable = !is_device_address(sp) && !pinned(sp, n);
  const bool dst_pageable = !is_device_address(d) && !pinned(d, n);
  if (src_pageable) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + n);
    o->run = [to, staged] { std::memcpy(to, staged->data(), staged->size()); };
  } else {
    const void* from = alias_of(sp);
    o->run = [to, from, n] { std::memmove(to, from, n); };
  }
  const uint64_t seq = enqueue(*s, std::move(o));
  check_access(*s, seq, sp, n, /*host_ok=*/true, std::string(call) + " (source)");
  check_access(*s, seq, d, n, /*host_ok=*/true, std::string(call) + " (destination)",
               /*write=*/true);
  if (synchronous || dst_pageable) {
    const vclock clock = s->clock;
    host_wait(lock, {s, seq}, clock);
  }
  (void)r;
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaMallocAsync(void** out, size_t bytes, cudaStream_t s) {
  return malloc_async(out, bytes, nullptr, s, false, "cudaMallocAsync");
}
cudaError_t cudaMallocAsync_ptsz(void** out, size_t bytes, cudaStream_t s) {
  return malloc_async(out, bytes, nullptr, s, true, "cudaMallocAsync");
}
cudaError_t cudaMallocFromPoolAsync(void** out, size_t bytes, cudaMemPool_t pool, cudaStream_t s) {
  if (pool == nullptr) return ret(cudaErrorInvalidValue);
  return malloc_async(out, bytes, pool, s, false, "cudaMallocFromPoolAsync");
}
cudaError_t cudaMallocFromPoolAsync_ptsz(void** out, size_t bytes, cudaMemPool_t pool,
                                         cudaStream_t s) {
  if (pool == nullptr) return ret(cudaErrorInvalidValue);
  return malloc_async(out, bytes, pool, s, true, "cudaMallocFromPoolAsync");
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  return free_async(p, s, false);
}
cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) {
  return free_async(p, s, true);
}

cudaError_t cudaMalloc(void** out, size_t bytes) {
  SIMCUDA_ENTER("cudaMalloc");
  if (out == nullptr) return ret(cudaErrorInvalidValue);
  // cudaThreadExchangeStreamCaptureMode: "During stream capture (see cudaStreamBeginCapture),
  // some actions, such as a call to cudaMalloc, may be unsafe."
  if (refuse_unsafe_call()) return ret(cudaErrorStreamCaptureUnsupported);
  device_obj& d = context_device();
  if (r.cfg.oom_after_allocations >= 0 && r.allocations++ >= r.cfg.oom_after_allocations) {
    return ret(cudaErrorMemoryAllocation);
  }
  const size_t size = round_up(std::max<size_t>(bytes, 1), kAlign);
  const uintptr_t p = reserve(d, size);
  if (p == 0) return ret(cudaErrorMemoryAllocation);
  device_barrier(d, "cudaMalloc");
  auto a = std::make_unique<allocation>();
  a->base = p;
  a->bytes = size;
  a->alloc_what = "cudaMalloc";
  r.freed.erase(p);
  r.live[p] = std::move(a);
  *out = reinterpret_cast<void*>(p);
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  SIMCUDA_ENTER("cudaFree");
  context_device();  // cudaFree(nullptr) is the customary way to initialize the runtime
  // Even cudaFree(NULL): NVIDIA's Warp names "cudaFree(0) during lazy context / allocator init"
  // among the capture-unsafe calls that need the relaxed mode (warp.CaptureMode).
  check_unsafe_unverified("cudaFree");
  if (p == nullptr) return cudaSuccess;
  const auto base = reinterpret_cast<uintptr_t>(p);
  auto it = r.live.find(base);
  if (it == r.live.end()) {
    violation(format("cudaFree(%p): not an allocation%s", p,
                     r.freed.count(base) ? " (freed already)" : ""));
    return ret(cudaErrorInvalidValue);
  }
  allocation& a = *it->second;
  if (a.graph_mem != nullptr) {
    // cudaGraphAddMemAllocNode: an allocation not freed in its graph can be freed "by passing
    // the allocation to cudaMemFreeAsync or cudaMemFree".
    for (const auto& [stream_id, access] : a.accesses)
      if (r.host_clock.get(stream_id) < access.seq) {
        violation(format("cudaFree(%p) while %s may still run", p, access.what.c_str()));
      }
    if (a.exec != nullptr) {
      auto& unfreed = a.exec->unfreed;
      unfreed.erase(std::remove(unfreed.begin(), unfreed.end(), base), unfreed.end());
    }
    a.graph_mem.reset();
  } else if (a.pool != nullptr) {
    // cudaFree: "This API will not perform any implicit synchronization when the pointer was
    // allocated with cudaMallocAsync or cudaMallocFromPoolAsync. Callers must ensure that all
    // accesses to these pointer have completed before invoking cudaFree."
    for (const auto& [stream_id, access] : a.accesses)
      if (r.host_clock.get(stream_id) < access.seq) {
        violation(format("cudaFree(%p) while %s may still run", p, access.what.c_str()));
      }
    if (a.pool->imported) {
      release_import(*a.pool, base);
    } else {
      if (a.pool->handle_types != 0) {
        check_no_live_imports(*r.devices[a.pool->device], base, "cudaFree");
      }
      chunk_of(*a.pool, base)->live--;
      a.pool->used -= a.bytes;
      a.pool->free_blocks.push_back(
          {base, a.bytes, r.devices[a.pool->device]->legacy, 0, true, ++r.free_order});
    }
  } else {
    // "For all other pointers, this API may perform implicit synchronization."
    device_obj& owner = *device_of(base);
    device_wait(lock, owner);
    release(owner, base, a.bytes);
  }
  a.freed = true;
  a.free_what = "cudaFree";
  auto node = r.live.extract(base);
  r.freed[base] = std::move(node.mapped());
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  SIMCUDA_ENTER("cudaMemGetInfo");
  if (free_bytes == nullptr || total == nullptr) return ret(cudaErrorInvalidValue);
  device_obj& d = context_device();
  *total = d.capacity;
  *free_bytes = d.capacity - d.reserved;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** out, size_t bytes, unsigned int flags) {
  SIMCUDA_ENTER("cudaHostAlloc");
  if (out == nullptr) return ret(cudaErrorInvalidValue);
  (void)flags;  // with unified addressing all page-locked memory is mapped and portable
  check_unsafe_unverified("cudaHostAlloc");
  for (auto& d : r.devices)
    if (d->legacy != nullptr) device_barrier(*d, "cudaHostAlloc");
  const size_t size = round_up(std::max<size_t>(bytes, 1), 4096);
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ret(cudaErrorMemoryAllocation);
  r.pinned[reinterpret_cast<uintptr_t>(p)] = size;
  *out = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  SIMCUDA_ENTER("cudaFreeHost");
  const auto base = reinterpret_cast<uintptr_t>(p);
  auto it = r.pinned.find(base);
  if (it == r.pinned.end()) {
    violation(format("cudaFreeHost(%p): not page-locked memory from cudaHostAlloc", p));
    return ret(cudaErrorInvalidValue);
  }
  for (auto& [h, s] : r.streams)
    for (const auto& o : s->queue)
      if (o->watches >= base && o->watches < base + it->second) {
        violation(format("cudaFreeHost(%p) while %s on %s still uses it", p, o->what.c_str(),
                         s->name().c_str()));
        return ret(cudaErrorInvalidValue);
      }
  munmap(p, it->second);
  r.pinned.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** device, void* host, unsigned int flags) {
  SIMCUDA_ENTER("cudaHostGetDevicePointer");
  if (device == nullptr || flags != 0 || !pinned(reinterpret_cast<uintptr_t>(host), 1)) {
    return ret(cudaErrorInvalidValue);
  }
  *device = host;  // unified addressing: the same address on the device
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
  SIMCUDA_ENTER("cudaMemcpyAsync");
  return memcpy_async(dst, src, n, kind, s, false, "cudaMemcpyAsync", lock, false);
}
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                                 cudaStream_t s) {
  SIMCUDA_ENTER("cudaMemcpyAsync");
  return memcpy_async(dst, src, n, kind, s, true, "cudaMemcpyAsync", lock, false);
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  SIMCUDA_ENTER("cudaMemcpy");
  check_unsafe_unverified("cudaMemcpy");
  return memcpy_async(dst, src, n, kind, nullptr, false, "cudaMemcpy", lock, true);
}
cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  SIMCUDA_ENTER("cudaMemcpy");
  check_unsafe_unverified("cudaMemcpy");
  return memcpy_async(dst, src, n, kind, nullptr, true, "cudaMemcpy", lock, true);
}

static cudaError_t memset_async(void* p, int value, size_t n, cudaStream_t stream, bool ptds) {
  SIMCUDA_ENTER("cudaMemsetAsync");
  stream_obj* s = resolve_stream(stream, ptds, "cudaMemsetAsync");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (!is_device_address(addr)) {
    violation(format("cudaMemsetAsync(%p) on %s: not device memory", p, s->name().c_str()));
    return ret(cudaErrorInvalidValue);
  }
  cudaError_t e = cudaSuccess;
  graph_node* node = nullptr;
  if (capture_node(*s, "cudaMemsetAsync", &e, &node)) {
    if (node != nullptr) {
      node->run = [addr, value, n] { std::memset(alias_of(addr), value, n); };
      node->touches.push_back({addr, n, false, "cudaMemsetAsync", true});
    }
    return ret(e);
  }
  auto o = std::make_unique<op>();
  o->what = "cudaMemsetAsync";
  void* to = alias_of(addr);
  o->run = [to, value, n] { std::memset(to, value, n); };
  const uint64_t seq = enqueue(*s, std::move(o));
  check_access(*s, seq, addr, n, false, "cudaMemsetAsync", /*write=*/true);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
  return memset_async(p, value, n, s, false);
}
cudaError_t cudaMemsetAsync_ptsz(void* p, int value, size_t n, cudaStream_t s) {
  return memset_async(p, value, n, s, true);
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* out, int device) {
  SIMCUDA_ENTER("cudaDeviceGetDefaultMemPool");
  device_obj* d = device_at(device);
  if (out == nullptr || d == nullptr)
    return ret(d == nullptr ? cudaErrorInvalidDevice : cudaErrorInvalidValue);
  ensure_context(*d);
  *out = reinterpret_cast<cudaMemPool_t>(d->default_pool->handle);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetMemPool(cudaMemPool_t* out, int device) {
  SIMCUDA_ENTER("cudaDeviceGetMemPool");
  device_obj* d = device_at(device);
  if (out == nullptr || d == nullptr)
    return ret(d == nullptr ? cudaErrorInvalidDevice : cudaErrorInvalidValue);
  ensure_context(*d);
  *out = reinterpret_cast<cudaMemPool_t>(d->current_pool->handle);
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* out, const cudaMemPoolProps* props) {
  SIMCUDA_ENTER("cudaMemPoolCreate");
  check_unsafe_unverified("cudaMemPoolCreate");  // CCCL refuses it to a capturing thread
  if (out == nullptr || props == nullptr) return ret(cudaErrorInvalidValue);
  if (props->allocType != cudaMemAllocationTypePinned ||
      props->location.type != cudaMemLocationTypeDevice) {
    return ret(cudaErrorInvalidValue);
  }
  device_obj* d = device_at(props->location.id);
  if (d == nullptr) return ret(cudaErrorInvalidDevice);
  if ((props->handleTypes & ~cudaMemHandleTypePosixFileDescriptor) != 0) {
    return ret(cudaErrorNotSupported);
  }
  ensure_context(*d);
  pool_obj* pool = make_pool(*d);
  pool->max_size = props->maxSize;
  pool->handle_types = props->handleTypes;
  *out = reinterpret_cast<cudaMemPool_t>(pool->handle);
  return cudaSuccess;
}

cudaError_t cudaMemPoolDestroy(cudaMemPool_t handle) {
  SIMCUDA_ENTER("cudaMemPoolDestroy");
  check_unsafe_unverified("cudaMemPoolDestroy");  // CCCL refuses it to a capturing thread
  pool_obj* pool = resolve_pool(handle, "cudaMemPoolDestroy");
  if (pool == nullptr) return ret(cudaErrorInvalidValue);
  if (pool->is_default) return ret(cudaErrorInvalidValue);
  // cudaMemPoolDestroy: "If any pointers obtained from this pool haven't been freed or the
  // pool has free operations that haven't completed when cudaMemPoolDestroy is invoked, the
  // function will return immediately and the resources associated with the pool will be
  // released automatically once there are no more outstanding allocations." Here: what is
  // free now goes back; outstanding blocks keep their chunks.
  pool->destroyed = true;
  trim(*pool, 0);
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t handle, cudaMemPoolAttr attr, void* value) {
  SIMCUDA_ENTER("cudaMemPoolSetAttribute");
  check_unsafe_unverified("cudaMemPoolSetAttribute");  // CCCL refuses it to a capturing thread
  pool_obj* pool = resolve_pool(handle, "cudaMemPoolSetAttribute");
  if (pool == nullptr || value == nullptr) return ret(cudaErrorInvalidValue);
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
      pool->follow_event_dependencies = *static_cast<int*>(value);
      return cudaSuccess;
    case cudaMemPoolReuseAllowOpportunistic:
      pool->allow_opportunistic = *static_cast<int*>(value);
      return cudaSuccess;
    case cudaMemPoolReuseAllowInternalDependencies:
      pool->allow_internal_dependencies = *static_cast<int*>(value);
      return cudaSuccess;
    case cudaMemPoolAttrReleaseThreshold:
      pool->release_threshold = *static_cast<uint64_t*>(value);
      return cudaSuccess;
    // "High watermark can only be reset to zero."
    case cudaMemPoolAttrReservedMemHigh:
      if (*static_cast<uint64_t*>(value) != 0) return ret(cudaErrorInvalidValue);
      pool->reserved_high = pool->reserved;
      return cudaSuccess;
    case cudaMemPoolAttrUsedMemHigh:
      if (*static_cast<uint64_t*>(value) != 0) return ret(cudaErrorInvalidValue);
      pool->used_high = pool->used;
      return cudaSuccess;
    default:
      return ret(cudaErrorInvalidValue);
  }
}

cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t handle, cudaMemPoolAttr attr, void* value) {
  SIMCUDA_ENTER("cudaMemPoolGetAttribute");
  check_unsafe_unverified("cudaMemPoolGetAttribute");  // CCCL refuses it to a capturing thread
  pool_obj* pool = resolve_pool(handle, "cudaMemPoolGetAttribute");
  if (pool == nullptr || value == nullptr) return ret(cudaErrorInvalidValue);
  auto u64 = [&](uint64_t v) {
    *static_cast<uint64_t*>(value) = v;
    return cudaSuccess;
  };
  auto i32 = [&](int v) {
    *static_cast<int*>(value) = v;
    return cudaSuccess;
  };
  switch (attr) {
    case cudaMemPoolReuseFollowEventDependencies:
      return i32(pool->follow_event_dependencies);
    case cudaMemPoolReuseAllowOpportunistic:
      return i32(pool->allow_opportunistic);
    case cudaMemPoolReuseAllowInternalDependencies:
      return i32(pool->allow_internal_dependencies);
    case cudaMemPoolAttrReleaseThreshold:
      return u64(pool->release_threshold);
    case cudaMemPoolAttrReservedMemCurrent:
      return u64(pool->reserved);
    case cudaMemPoolAttrReservedMemHigh:
      return u64(pool->reserved_high);
    case cudaMemPoolAttrUsedMemCurrent:
      return u64(pool->used);
    case cudaMemPoolAttrUsedMemHigh:
      return u64(pool->used_high);
    default:
      return ret(cudaErrorInvalidValue);
  }
}

cudaError_t cudaMemPoolTrimTo(cudaMemPool_t handle, size_t keep) {
  SIMCUDA_ENTER("cudaMemPoolTrimTo");
  pool_obj* pool = resolve_pool(handle, "cudaMemPoolTrimTo");
  if (pool == nullptr) return ret(cudaErrorInvalidValue);
  // cudaMemPoolTrimTo: "The allocator cannot release OS allocations that back outstanding
  // asynchronous allocations." and "Allocations that have been asynchronously freed but whose
  // completion has not been observed on the host (eg. by a synchronize) can count as
  // outstanding."
  trim(*pool, keep);
  return cudaSuccess;
}

cudaError_t cudaMemPoolGetAccess(cudaMemAccessFlags* flags, cudaMemPool_t handle,
                                 cudaMemLocation* location) {
  SIMCUDA_ENTER("cudaMemPoolGetAccess");
  check_unsafe_unverified("cudaMemPoolGetAccess");  // a pool call (CCCL)
  pool_obj* pool = resolve_pool(handle, "cudaMemPoolGetAccess");
  if (pool == nullptr || flags == nullptr || location == nullptr ||
      location->type != cudaMemLocationTypeDevice) {
    return ret(cudaErrorInvalidValue);
  }
  if (device_at(location->id) == nullptr) return ret(cudaErrorInvalidDevice);
  // "Returns the accessibility of the pool's memory from the specified location."
  const bool granted =
      location->id == pool->device ||
      std::find(pool->peers.begin(), pool->peers.end(), location->id) != pool->peers.end();
  *flags = granted ? cudaMemAccessFlagsProtReadWrite : cudaMemAccessFlagsProtNone;
  return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int device, int peer) {
  SIMCUDA_ENTER("cudaDeviceCanAccessPeer");
  if (can == nullptr) return ret(cudaErrorInvalidValue);
  if (device_at(device) == nullptr || device_at(peer) == nullptr) {
    return ret(cudaErrorInvalidDevice);
  }
  // "Returns in *canAccessPeer a value of 1 if device device is capable of directly accessing
  // memory from peerDevice and 0 otherwise." simcuda's devices all reach one another (as
  // NVLink-connected GPUs do); a device and itself answer 0.
  *can = device != peer ? 1 : 0;
  return cudaSuccess;
}

cudaError_t cudaMemPoolSetAccess(cudaMemPool_t handle, const cudaMemAccessDesc* descs,
                                 size_t count) {
  SIMCUDA_ENTER("cudaMemPoolSetAccess");
  check_unsafe_unverified("cudaMemPoolSetAccess");  // a pool call (CCCL)
  pool_obj* pool = resolve_pool(handle, "cudaMemPoolSetAccess");
  if (pool == nullptr || (descs == nullptr && count > 0)) return ret(cudaErrorInvalidValue);
  for (size_t i = 0; i < count; ++i) {
    if (descs[i].location.type != cudaMemLocationTypeDevice) return ret(cudaErrorInvalidValue);
    if (device_at(descs[i].location.id) == nullptr) return ret(cudaErrorInvalidDevice);
  }
  for (size_t i = 0; i < count; ++i) {
    const int peer = descs[i].location.id;
    auto& peers = pool->peers;
    peers.erase(std::remove(peers.begin(), peers.end(), peer), peers.end());
    if (descs[i].flags != cudaMemAccessFlagsProtNone && peer != pool->device) {
      peers.push_back(peer);
    }
  }
  return cudaSuccess;
}

}  // extern "C"
