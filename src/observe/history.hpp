// The memory history (design.md §11): a bounded ring of what happened to arcpool's blocks, and
// the state of every block arcpool holds, written as PyTorch's memory snapshot
// (torch.cuda.memory._snapshot()) so that PyTorch's _memory_viz.py and the memory_viz page
// read it.
//
// A block is memory arcpool took from the pool: a "segment" in PyTorch's terms, holding one
// block of the same size. It is active_allocated while an allocation lives in it,
// active_pending_free once deallocated until its free completed (the block went back to a
// stream's cache or to the pool), and inactive while cached. Graph allocations and graph
// pools' reserves are not recorded (docs/graphs.md).
//
// Off unless the allocator was created with history (its option or ARCPOOL_HISTORY): the
// block table must be complete from the start for the snapshot's totals to be the
// allocator's. When on, every recorded operation takes the history's mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "drivers/driver.hpp"

namespace arcpool::detail {

class history {
 public:
  /// A history of the last `entries` actions (0: off, and every call below is a no-op). Its
  /// ring is made now (std::bad_alloc if the host has no memory for it), so that recording an
  /// action allocates nothing.
  explicit history(size_t entries) : capacity_(entries) { ring_.reserve(entries); }

  /// The most entries a ring can hold (more is refused when the allocator is created).
  static size_t max_entries() noexcept { return std::vector<entry>().max_size(); }
  history(const history&) = delete;
  history& operator=(const history&) = delete;

  /// True when recording (fixed at construction: a plain read).
  bool enabled() const noexcept { return capacity_ != 0; }

  /// arcpool took `bytes` at `base` from the pool on stream `s`. Without host memory to note
  /// the block, the history leaves it out (the calls below then ignore it): recording never
  /// fails, since its callers cannot (the memory is taken, or a deallocation committed).
  void segment_alloc(const void* base, size_t bytes, stream_handle s) noexcept;
  /// An allocation of `requested` bytes at `data` (the caller's pointer, `base` aligned up) now
  /// lives in the block at `base`. Its trace entries name `data`, as PyTorch's name the pointer
  /// handed out.
  void alloc(const void* base, const void* data, size_t requested, stream_handle s) noexcept;
  /// The allocation in the block at `base` was deallocated on `s`.
  void free_requested(const void* base, stream_handle s) noexcept;
  /// The block at `base` is reusable: kept in the cache of stream `s`.
  void free_completed(const void* base, stream_handle s) noexcept;
  /// The block at `base` leaves arcpool (to the pool, or exported), on stream `s`. Records the
  /// free's request and completion first where they were not recorded. Call it before the
  /// memory is given back, so that no other thread can be handed the address first.
  void segment_free(const void* base, stream_handle s) noexcept;

  /// The snapshot as a pickle: `segments` (one per block held, sorted by address) and
  /// `device_traces` (the ring, oldest first, in the list of `device`).
  std::string snapshot_pickle(int device) const;

 private:
  enum class action : uint8_t {
    alloc,
    free_requested,
    free_completed,
    segment_alloc,
    segment_free
  };
  enum class state : uint8_t { active_allocated, active_pending_free, inactive };
  struct entry {
    action what;
    uintptr_t address;
    size_t size;
    uintptr_t stream;
    int64_t time_us;
  };
  struct block {
    size_t bytes = 0;
    size_t requested = 0;  ///< 0 while inactive
    uintptr_t stream = 0;
    state st = state::inactive;
    /// The allocation's data pointer past the block's start (an alignment above the pool's):
    /// its own block in the snapshot, after an inactive one of these bytes. 0 while inactive.
    size_t offset = 0;
  };

  /// Appends to the ring, dropping the oldest entry when full. Under mutex_.
  void record(action what, uintptr_t address, size_t size, uintptr_t stream) noexcept;

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::vector<entry> ring_;  ///< grows to capacity_, then wraps at next_
  size_t next_ = 0;
  std::unordered_map<uintptr_t, block> blocks_;
};

}  // namespace arcpool::detail
