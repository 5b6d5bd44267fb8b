// Status results and the calling thread's last-error message.
#pragma once

#include <string>

#include "arcpool/arcpool.h"

namespace arcpool::detail {

/// Sets the calling thread's last-error message to `status`'s name and the printf-formatted
/// message, and returns `status`. The one way internal code reports a failure.
arcpool_status_t fail(arcpool_status_t status, const char* format, ...)
    __attribute__((format(printf, 2, 3)));

/// Appends `context` to the calling thread's last-error message.
void append_to_last_error(const char* context);

/// The calling thread's last-error message.
const std::string& last_error() noexcept;

/// Returns early from the enclosing function when `expr` is not ARCPOOL_STATUS_SUCCESS.
#define ARCPOOL_RETURN_IF_ERROR(expr)                                                         \
  do {                                                                                        \
    if (arcpool_status_t arcpool_status_ = (expr); arcpool_status_ != ARCPOOL_STATUS_SUCCESS) \
      return arcpool_status_;                                                                 \
  } while (0)

}  // namespace arcpool::detail
