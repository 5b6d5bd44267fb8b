// NVTX (design.md §11): a domain "arcpool", a range per public operation with the size as the
// payload and the stream in the message, one category per kind of operation, and the
// allocations named as memory regions so that Nsight Systems / Compute show them. When no tool
// is attached each call costs one load and one predictable branch.
#pragma once

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
  reclaim,
};

/// True when an NVTX tool is attached (decided once, at the first use).
bool enabled() noexcept;

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

/// Names [pointer, pointer + bytes) "arcpool #serial" in the tools (a no-op without a tool).
void name_region(const void* pointer, size_t bytes, uint64_t serial) noexcept;
/// Forgets the region starting at `pointer`.
void forget_region(const void* pointer) noexcept;

}  // namespace arcpool::detail::nvtx
