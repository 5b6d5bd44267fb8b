// Graph pools (docs/graphs.md): blocks of the allocator's pool reserved outside any capture and
// lent only to the captures bound to the pool, with the reuse rule that keeps unjoined branches
// of a captured graph apart.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "arcpool/arcpool.h"
#include "core/fence.hpp"
#include "support/refcount.hpp"

namespace arcpool::detail {

class allocator;

/// One graph pool. Reference-counted: the user's handle, each capture bound to it (until that
/// capture's graph is gone) and each live allocation lent from it hold one. It counts as a
/// record of its allocator, which therefore outlives it.
class graph_pool {
 public:
  /// Where a free block may be lent again: `capture` 0 means any capture bound to the pool;
  /// otherwise only allocations on stream `stream` in capture `capture` (stream order there
  /// puts them after the free; another branch of the graph may not be).
  struct tag {
    uint64_t capture = 0;
    uint64_t stream = 0;
  };

  explicit graph_pool(allocator& owner);
  graph_pool(const graph_pool&) = delete;
  graph_pool& operator=(const graph_pool&) = delete;

  void retain() noexcept { refs_.increment(); }
  /// Drops a reference. The last one hands every block to the reclaim worker (no CUDA call:
  /// it may run on the CUDA runtime's thread of a user-object destructor) and deletes the pool.
  void release() noexcept;

  allocator& owner() const noexcept { return owner_; }

  /// A block of at least `bytes` for an allocation on stream `stream` in capture `capture`: a
  /// free block the tag rule allows, else a new one reserved from the allocator's pool, once
  /// the free list has room for its return (OUT_OF_MEMORY, nothing reserved, if not). `*where`:
  /// the block's tag, under which an allocation that cannot keep it gives it back.
  arcpool_status_t take(size_t bytes, uint64_t capture, uint64_t stream, void** base,
                        size_t* held_bytes, tag* where);
  /// Takes back a block lent out, free for what `where` allows. `fences`: the uses outside
  /// any capture that the block's final release waits for. Allocates nothing (its room was
  /// made when it was lent), so that it cannot fail after a deallocation committed.
  void give(void* base, size_t held_bytes, tag where, fence_list fences) noexcept;
  /// Writes off a block lent out that cannot come back (a leaked allocation whose implicit
  /// free failed): it stays reserved in the allocator's pool, counted in graph_pool_bytes, as
  /// other memory whose implicit free failed stays in the pool; its reference goes. Allocates
  /// nothing.
  void abandon() noexcept;
  /// Capture `capture` is bound to the pool, which will hear (capture_ended) when its graph is
  /// gone, whether or not the application ended the binding first. OUT_OF_MEMORY, nothing
  /// changed, when the host has no memory to note it.
  arcpool_status_t capture_bound(uint64_t capture);
  /// True while the pool will hear of the end of `capture`'s graph.
  bool hears_of(uint64_t capture);
  /// Capture `capture`'s graph is gone: its freed blocks become free for any bound capture.
  void capture_ended(uint64_t capture);
  /// Takes back one capture_bound of `capture` whose notice of the graph's end could not be
  /// armed: the blocks keep their tags, and an earlier notice of that capture stands.
  void capture_unbound(uint64_t capture) noexcept;

  /// The C handle's type is the pool itself.
  static graph_pool* from(arcpool_graph_pool_t* h) noexcept {
    return reinterpret_cast<graph_pool*>(h);
  }
  arcpool_graph_pool_t* handle() noexcept { return reinterpret_cast<arcpool_graph_pool_t*>(this); }

 private:
  ~graph_pool() = default;

  struct block {
    void* base = nullptr;
    size_t bytes = 0;
    tag where;
    fence_list fences;
  };

  /// Reserves a new block of `bytes` from the allocator's pool into `*base`, usable by any
  /// stream once it returns (the allocation's stream is synchronized).
  arcpool_status_t grow(size_t bytes, void** base);
  /// True once every fence of `b` completed (those that did are dropped): a launch of the graph
  /// being captured is ordered after no work outside it, so a block freed outside every capture
  /// is lent only then. Queries never block (lock held).
  bool work_done(block& b);

  allocator& owner_;
  refcount refs_{1};
  std::mutex mutex_;
  std::vector<block> free_;         ///< blocks not lent out now, with room for the lent ones
  size_t lent_ = 0;                 ///< blocks lent out (or being reserved) now
  std::vector<uint64_t> captures_;  ///< bound captures whose graphs live
};

}  // namespace arcpool::detail
