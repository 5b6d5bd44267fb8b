// The fast path's store (design.md §7): blocks recently freed on one stream, kept for reuse by
// later allocations on the same stream, where stream order makes reuse safe with no event.
// Exact sizes only, so that caching never rounds an allocation up; bounded in bytes.
#pragma once

#include <cstddef>
#include <mutex>
#include <new>
#include <vector>

#include "support/spinlock.hpp"

namespace arcpool::detail {

class block_cache {
 public:
  /// A cached block of exactly `bytes`, or null. Runs `under_lock(guard())` under the cache's
  /// lock when it takes one (a stream's statistics row counts the hit there). Cost: a spinlock
  /// and a probe of a few bins.
  template <class F>
  void* take(size_t bytes, F&& under_lock) {
    std::lock_guard<spinlock> lock(lock_);
    bin* b = find(bytes);
    if (b == nullptr || b->blocks.empty()) return nullptr;
    void* p = b->blocks.back();
    b->blocks.pop_back();
    bytes_ -= bytes;
    under_lock(static_cast<const spinlock&>(lock_));
    return p;
  }

  /// Keeps `p` (of `bytes`) if the cache is open, would hold at most `limit` bytes with it and
  /// has a bin for its size with room (host memory permitting), and `commit(guard())`, run
  /// under the cache's lock once all of that holds, returns true; otherwise keeps nothing.
  /// Throws only what `commit` throws. The caller has enqueued every wait the block needs on
  /// the cache's stream. Cost: a spinlock and a probe of a few bins.
  template <class F>
  [[gnu::always_inline]] bool put_if(void* p, size_t bytes, size_t limit, F&& commit) {
    std::lock_guard<spinlock> lock(lock_);
    if (closed_ || bytes_ + bytes > limit) return false;
    bin* b = find(bytes);
    if (b == nullptr) b = claim(bytes);
    if (b == nullptr) return false;
    // Room first, before the commit: without host memory for it the block is not kept (the
    // caller frees it), and a caller that committed already loses nothing.
    if (b->blocks.size() == b->blocks.capacity()) {
      try {
        b->blocks.reserve(2 * b->blocks.size() + 4);
      } catch (const std::bad_alloc&) {
        return false;
      }
    }
    if (!commit(static_cast<const spinlock&>(lock_))) return false;
    b->blocks.push_back(p);
    bytes_ += bytes;
    return true;
  }

  /// Gives every block to `free_block(pointer, bytes)` (under the cache's lock, so that a
  /// concurrent retirement waits) and returns the bytes given; `close` refuses later puts (the
  /// stream is being retired).
  template <class F>
  size_t drain(F&& free_block, bool close = false) {
    std::lock_guard<spinlock> lock(lock_);
    closed_ = closed_ || close;
    size_t given = 0;
    for (bin& b : bins_) {
      for (void* p : b.blocks)
        free_block(p, b.size);
      given += b.size * b.blocks.size();
      b.blocks.clear();
      b.size = 0;
    }
    bytes_ = 0;
    return given;
  }

  /// Takes puts again after a drain that closed the cache, when the stream's retirement failed.
  void reopen() {
    std::lock_guard<spinlock> lock(lock_);
    closed_ = false;
  }

  /// Bytes cached now.
  size_t bytes() {
    std::lock_guard<spinlock> lock(lock_);
    return bytes_;
  }

  /// The lock every operation takes: a stream's own statistics row changes under it
  /// (stream_stats::guard_with).
  spinlock& guard() noexcept { return lock_; }

 private:
  /// Blocks of one exact size. size 0: free bin.
  struct bin {
    size_t size = 0;
    std::vector<void*> blocks;
  };
  static constexpr size_t kBins = 64;  // distinct sizes per stream; a power of two
  static constexpr size_t kProbes = 8;

  static size_t slot(size_t bytes) noexcept { return (bytes * 0x9E3779B97F4A7C15ull) >> 58; }

  bin* find(size_t bytes) noexcept {
    if (bins_[last_].size == bytes) return &bins_[last_];  // a stream's sizes repeat
    for (size_t i = 0, s = slot(bytes); i < kProbes; ++i, s = (s + 1) % kBins) {
      if (bins_[s].size == bytes) {
        last_ = s;
        return &bins_[s];
      }
    }
    return nullptr;
  }
  /// A bin for a new size: a free one, or one of another size that is empty now.
  bin* claim(size_t bytes) noexcept {
    for (size_t i = 0, s = slot(bytes); i < kProbes; ++i, s = (s + 1) % kBins) {
      if (bins_[s].size == 0 || bins_[s].blocks.empty()) {
        bins_[s].size = bytes;
        return &bins_[s];
      }
    }
    return nullptr;
  }

  spinlock lock_;
  size_t last_ = 0;  ///< the bin found last: tried first
  bin bins_[kBins];
  size_t bytes_ = 0;
  bool closed_ = false;
};

}  // namespace arcpool::detail
