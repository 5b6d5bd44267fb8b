#include "support/status.hpp"

#include <cstdarg>
#include <cstdio>

namespace arcpool::detail {
namespace {
thread_local std::string t_last_error;
}  // namespace

arcpool_status_t fail(arcpool_status_t status, const char* format, ...) {
  char message[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  t_last_error = arcpool_status_string(status);
  t_last_error += ": ";
  t_last_error += message;
  return status;
}

void append_to_last_error(const char* context) {
  t_last_error += context;
}

const std::string& last_error() noexcept {
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
  return arcpool::detail::last_error().c_str();
}

}  // extern "C"
