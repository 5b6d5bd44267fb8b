// The C API's entry-point helpers, shared by its files (c_api*.cpp): each entry validates its
// arguments, then runs the model's call guarded, so that no exception crosses the C API, and
// inside an NVTX range when a tool is attached (design.md §11).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <type_traits>

#include "arcpool/arcpool.h"
#include "observe/nvtx.hpp"
#include "support/status.hpp"

namespace arcpool::detail::api {

/// Runs `body` and turns an escaping exception into a status.
template <class F>
[[gnu::always_inline]] inline arcpool_status_t guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "host memory exhausted");
  } catch (const std::exception& e) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "internal error: %s", e.what());
  }
}

/// Runs `body(args...)` guarded, inside an NVTX range of `kind` when a tool is attached. The
/// range, and the first use's decision whether a tool is attached, are out of line: without a
/// tool an entry point pays one load and a branch for them (design.md §11). `body` captures
/// nothing and is handed its arguments, so that they stay in registers on the way without a
/// tool (a capturing lambda would be built in memory before the test).
template <class F, class... Args>
[[gnu::noinline]] arcpool_status_t traced_in_range(nvtx::op kind, size_t bytes,
                                                   arcpool_stream_t stream, F body,
                                                   Args... args) noexcept {
  nvtx::range range(kind, bytes, stream);  // pushes nothing when the decision was "no tool"
  return guarded([&] { return body(args...); });
}
template <class F, class... Args>
[[gnu::always_inline]] inline arcpool_status_t traced(nvtx::op kind, size_t bytes,
                                                      arcpool_stream_t stream, F body,
                                                      Args... args) noexcept {
  static_assert(std::is_empty_v<F>, "a traced body captures nothing: pass its arguments");
  if (nvtx::maybe_enabled()) return traced_in_range(kind, bytes, stream, body, args...);
  return guarded([&] { return body(args...); });
}

/// INVALID_ARGUMENT: `function` was given NULL for `argument`.
inline arcpool_status_t null_argument(const char* function, const char* argument) {
  return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", function, argument);
}

/// Copies the prefix of `full` that the caller's struct (of `struct_size` bytes) has room for,
/// keeping the caller's struct_size and version.
template <class T>
inline arcpool_status_t copy_versioned(const T& full, T* out, const char* function) {
  constexpr size_t kHeader = offsetof(T, version) + sizeof(uint32_t);
  const size_t size = out->struct_size;
  if (size < kHeader) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "%s: struct_size %zu is too small", function,
                size);
  }
  const size_t n = size < sizeof(T) ? size : sizeof(T);
  std::memcpy(reinterpret_cast<char*>(out) + kHeader,
              reinterpret_cast<const char*>(&full) + kHeader, n - kHeader);
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace arcpool::detail::api

/// Returns INVALID_ARGUMENT, naming the function and the argument, when `arg` is NULL.
#define ARCPOOL_REQUIRE_ARG(arg) \
  if ((arg) == nullptr) return ::arcpool::detail::api::null_argument(__func__, #arg)
