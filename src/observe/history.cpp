#include "observe/history.hpp"

#include <algorithm>
#include <chrono>
#include <new>

#include "observe/pickle_writer.hpp"

namespace arcpool::detail {
namespace {

uintptr_t key(const void* p) {
  return reinterpret_cast<uintptr_t>(p);
}
uintptr_t key(stream_handle s) {
  return reinterpret_cast<uintptr_t>(s);
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// PyTorch's caching allocator splits "small" pools (blocks up to 1 MiB) from "large" ones.
constexpr size_t kSmallSegment = size_t{1} << 20;

}  // namespace

void history::record(action what, uintptr_t address, size_t size, uintptr_t stream) noexcept {
  const entry e{what, address, size, stream, now_us()};
  if (ring_.size() < capacity_) {
    ring_.push_back(e);  // into the room made at construction
    return;
  }
  ring_[next_] = e;
  next_ = (next_ + 1) % capacity_;
}

void history::segment_alloc(const void* base, size_t bytes, stream_handle s) noexcept {
  if (!enabled() || base == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    blocks_[key(base)] = block{bytes, 0, key(s), state::inactive};
  } catch (const std::bad_alloc&) {
    return;  // left out of the history
  }
  record(action::segment_alloc, key(base), bytes, key(s));
}

void history::alloc(const void* base, const void* data, size_t requested,
                    stream_handle s) noexcept {
  if (!enabled() || base == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = blocks_.find(key(base));
  if (it == blocks_.end()) return;
  it->second.requested = requested;
  it->second.st = state::active_allocated;
  it->second.offset = key(data) - key(base);
  record(action::alloc, key(data), requested, key(s));
}

void history::free_requested(const void* base, stream_handle s) noexcept {
  if (!enabled() || base == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = blocks_.find(key(base));
  if (it == blocks_.end() || it->second.st != state::active_allocated) return;
  it->second.st = state::active_pending_free;
  record(action::free_requested, key(base) + it->second.offset, it->second.requested, key(s));
}

void history::free_completed(const void* base, stream_handle s) noexcept {
  if (!enabled() || base == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = blocks_.find(key(base));
  if (it == blocks_.end() || it->second.st == state::inactive) return;
  block& b = it->second;
  const uintptr_t data = key(base) + b.offset;
  if (b.st == state::active_allocated) record(action::free_requested, data, b.requested, key(s));
  record(action::free_completed, data, b.requested, key(s));
  b.st = state::inactive;
  b.requested = 0;
  b.offset = 0;
  b.stream = key(s);  // a cached block belongs to the cache's stream
}

void history::segment_free(const void* base, stream_handle s) noexcept {
  if (!enabled() || base == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = blocks_.find(key(base));
  if (it == blocks_.end()) return;
  const block b = it->second;
  blocks_.erase(it);
  const uintptr_t data = key(base) + b.offset;
  if (b.st == state::active_allocated) record(action::free_requested, data, b.requested, key(s));
  if (b.st != state::inactive) record(action::free_completed, data, b.requested, key(s));
  record(action::segment_free, key(base), b.bytes, key(s));
}

std::string history::snapshot_pickle(int device) const {
  static const char* const kActions[] = {"alloc", "free_requested", "free_completed",
                                         "segment_alloc", "segment_free"};
  static const char* const kStates[] = {"active_allocated", "active_pending_free", "inactive"};
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::pair<uintptr_t, block>> held(blocks_.begin(), blocks_.end());
  std::sort(held.begin(), held.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });

  pickle_writer w;
  w.begin_dict();
  w.string("segments");
  w.begin_list();
  for (const auto& [address, b] : held) {
    const bool active = b.st != state::inactive;
    const size_t allocated = b.st == state::active_allocated ? b.bytes : 0;
    w.begin_dict();
    w.string("device");
    w.integer(device);
    w.string("address");
    w.unsigned_integer(address);
    w.string("total_size");
    w.unsigned_integer(b.bytes);
    w.string("allocated_size");
    w.unsigned_integer(allocated);
    w.string("active_size");
    w.unsigned_integer(active ? b.bytes : 0);
    w.string("requested_size");
    w.unsigned_integer(b.requested);
    w.string("stream");
    w.unsigned_integer(b.stream);
    w.string("segment_type");
    w.string(b.bytes <= kSmallSegment ? "small" : "large");
    w.string("segment_pool_id");
    w.pair(0, 0);
    w.string("is_expandable");
    w.boolean(false);
    w.string("frames");
    w.begin_list();
    w.end_list();
    w.string("blocks");
    w.begin_list();
    auto write_block = [&w](uintptr_t at, size_t size, size_t requested, const char* st) {
      w.begin_dict();
      w.string("address");
      w.unsigned_integer(at);
      w.string("size");
      w.unsigned_integer(size);
      w.string("requested_size");
      w.unsigned_integer(requested);
      w.string("state");
      w.string(st);
      w.string("frames");
      w.begin_list();
      w.end_list();
      w.end_dict();
    };
    // An over-aligned allocation's padding before its data pointer: a block of its own, free.
    if (b.offset != 0)
      write_block(address, b.offset, 0, kStates[static_cast<int>(state::inactive)]);
    write_block(address + b.offset, b.bytes - b.offset, b.requested,
                kStates[static_cast<int>(b.st)]);
    w.end_list();
    w.end_dict();
  }
  w.end_list();

  w.string("device_traces");
  w.begin_list();
  for (int d = 0; d < device; ++d) {
    w.begin_list();
    w.end_list();
  }
  w.begin_list();
  const size_t n = ring_.size();
  const size_t oldest = n < capacity_ ? 0 : next_;
  for (size_t i = 0; i < n; ++i) {
    const entry& e = ring_[(oldest + i) % n];
    w.begin_dict();
    w.string("action");
    w.string(kActions[static_cast<int>(e.what)]);
    w.string("addr");
    w.unsigned_integer(e.address);
    w.string("size");
    w.unsigned_integer(e.size);
    w.string("stream");
    w.unsigned_integer(e.stream);
    w.string("time_us");
    w.integer(e.time_us);
    w.string("frames");
    w.begin_list();
    w.end_list();
    w.end_dict();
  }
  w.end_list();
  w.end_list();
  w.end_dict();
  return w.finish();
}

}  // namespace arcpool::detail
