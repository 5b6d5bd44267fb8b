// NVTX (design.md §11): a domain "arcpool", a range per public operation with the size as the
// payload and the stream in the message, one category per kind of operation, and the
// allocations named as memory regions so that Nsight Systems / Compute show them. When no tool
// is attached each call costs one load and one predictable branch.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "drivers/driver.hpp"

namespace arcpool::detail::nvtx {

/// Kinds of operation: the NVTX categories of the domain.
enum class op : uint32_t {
  allocate = 1,
  deallocate,
  transfer,
  record_use,
  preserve,
  discard,
  import,
  export_memory,
  trim,
};

/// Whether a tool is attached: -1 until decided (at the first use), then 0 or 1.
extern std::atomic<signed char> g_attached;
/// Decides whether a tool is attached (NVTX's domain creation), once.
bool decide() noexcept;

/// False once decided that no tool is attached: a caller that finds it true takes its slow path,
/// which asks enabled() (and so decides at the first use). One load and a branch, no call.
inline bool maybe_enabled() noexcept {
  return g_attached.load(std::memory_order_relaxed) != 0;
}

/// True when an NVTX tool is attached. Inline: one load and a predictable branch.
inline bool enabled() noexcept {
  const signed char v = g_attached.load(std::memory_order_relaxed);
  return v != 0 && (v > 0 || decide());  // no tool: one test
}

/// One NVTX range for the scope of a public operation.
class range {
 public:
  range(op kind, size_t bytes, stream_handle stream) noexcept {
    if (enabled()) push(kind, bytes, stream);
  }
  ~range() {
    if (pushed_) pop();
  }
  range(const range&) = delete;
  range& operator=(const range&) = delete;

 private:
  void push(op kind, size_t bytes, stream_handle stream) noexcept;
  void pop() noexcept;
  bool pushed_ = false;
};

void register_region(const void* pointer, size_t bytes, uint64_t serial) noexcept;
void unregister_region(const void* pointer) noexcept;

/// Names [pointer, pointer + bytes) "arcpool #serial" in the tools (a no-op without a tool).
inline void name_region(const void* pointer, size_t bytes, uint64_t serial) noexcept {
  if (enabled() && pointer != nullptr) register_region(pointer, bytes, serial);
}
/// Forgets the region starting at `pointer`.
inline void forget_region(const void* pointer) noexcept {
  if (enabled() && pointer != nullptr) unregister_region(pointer);
}

}  // namespace arcpool::detail::nvtx
