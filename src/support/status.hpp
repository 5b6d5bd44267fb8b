// Status results and the calling thread's last-error message.
#pragma once

#include <cstddef>

#include "arcpool/arcpool.h"

namespace arcpool::detail {

/// The most bytes a last-error message keeps, its terminating zero included (longer ones are
/// cut).
inline constexpr size_t kLastErrorBytes = 1024;

/// Sets the calling thread's last-error message to `status`'s name and the printf-formatted
/// message, and returns `status`. The one way internal code reports a failure. Allocates
/// nothing, so that it cannot fail (also when the host has no memory left).
arcpool_status_t fail(arcpool_status_t status, const char* format, ...) noexcept
    __attribute__((format(printf, 2, 3)));

/// Appends `context` to the calling thread's last-error message (cut at its room).
void append_to_last_error(const char* context) noexcept;

/// The calling thread's last-error message ("" before its first failure).
const char* last_error() noexcept;

/// Returns early from the enclosing function when `expr` is not ARCPOOL_STATUS_SUCCESS.
#define ARCPOOL_RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                        \
    if (arcpool_status_t arcpool_status_ = (expr); arcpool_status_ != ARCPOOL_STATUS_SUCCESS) \
      return arcpool_status_;                                                                 \
  } while (0)

}  // namespace arcpool::detail
