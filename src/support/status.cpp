#include "support/status.hpp"

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace arcpool::detail {
namespace {
/// The thread's last message, in place: setting it allocates nothing, so that a failure is
/// reported also when the host has no memory left (a guarded entry point's bad_alloc
/// included), where a growing string would throw again in a noexcept path.
thread_local char t_last_error[kLastErrorBytes];
}  // namespace

arcpool_status_t fail(arcpool_status_t status, const char* format, ...) noexcept {
  const int prefix =
      std::snprintf(t_last_error, sizeof(t_last_error), "%s: ", arcpool_status_string(status));
  va_list args;
  va_start(args, format);
  std::vsnprintf(t_last_error + prefix, sizeof(t_last_error) - prefix, format, args);
  va_end(args);
  return status;
}

void append_to_last_error(const char* context) noexcept {
  const size_t used = std::strlen(t_last_error);
  std::snprintf(t_last_error + used, sizeof(t_last_error) - used, "%s", context);
}

const char* last_error() noexcept {
  return t_last_error;
}

}  // namespace arcpool::detail

extern "C" {

const char* arcpool_status_string(arcpool_status_t status) {
  switch (status) {
    case ARCPOOL_STATUS_SUCCESS:
      return "ARCPOOL_STATUS_SUCCESS";
    case ARCPOOL_STATUS_INVALID_ARGUMENT:
      return "ARCPOOL_STATUS_INVALID_ARGUMENT";
    case ARCPOOL_STATUS_OUT_OF_MEMORY:
      return "ARCPOOL_STATUS_OUT_OF_MEMORY";
    case ARCPOOL_STATUS_NOT_OWNER:
      return "ARCPOOL_STATUS_NOT_OWNER";
    case ARCPOOL_STATUS_ALREADY_DEALLOCATED:
      return "ARCPOOL_STATUS_ALREADY_DEALLOCATED";
    case ARCPOOL_STATUS_UNKNOWN_POINTER:
      return "ARCPOOL_STATUS_UNKNOWN_POINTER";
    case ARCPOOL_STATUS_UNSUPPORTED:
      return "ARCPOOL_STATUS_UNSUPPORTED";
    case ARCPOOL_STATUS_CUDA_ERROR:
      return "ARCPOOL_STATUS_CUDA_ERROR";
    case ARCPOOL_STATUS_NOT_PERMITTED:
      return "ARCPOOL_STATUS_NOT_PERMITTED";
    case ARCPOOL_STATUS_NO_DEVICE:
      return "ARCPOOL_STATUS_NO_DEVICE";
    case ARCPOOL_STATUS_PEER_GONE:
      return "ARCPOOL_STATUS_PEER_GONE";
  }
  return "ARCPOOL_STATUS_(unknown)";
}

const char* arcpool_last_error(void) {
  return arcpool::detail::last_error();
}

}  // extern "C"
