// The C API of arcpool/ipc.h: argument checks, then the exporter and importer (src/ipc/).
#include <fcntl.h>
#include <sys/socket.h>

#include <new>

#include "api/entry.hpp"
#include "arcpool/ipc.h"
#include "core/allocator.hpp"
#include "ipc/exporter.hpp"
#include "ipc/importer.hpp"
#include "support/status.hpp"

using arcpool::detail::fail;
using arcpool::detail::api::null_argument;
using arcpool::detail::ipc::exporter;
using arcpool::detail::ipc::importer;

struct arcpool_ipc_exporter {
  exporter* impl;
};
struct arcpool_ipc_importer {
  importer* impl;
};

namespace {

arcpool_status_t bad_socket(const char* function, int fd) {
  return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
              "%s: socket_fd %d is not a descriptor (a connected AF_UNIX SOCK_STREAM socket)",
              function, fd);
}

/// SUCCESS when `fd` is what arcpool/ipc.h asks for: an AF_UNIX SOCK_STREAM socket (the pool's
/// descriptor travels as SCM_RIGHTS, the greeting's sender as SCM_CREDENTIALS) in blocking mode
/// (the greeting's read, the watcher and arcpool_ipc_receive wait on it; on a non-blocking one
/// the watcher's first read failed with EAGAIN, read as the importer's end, and the connection
/// was gone without a word).
arcpool_status_t check_socket(const char* function, int fd) {
  if (fd < 0) return bad_socket(function, fd);
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return bad_socket(function, fd);
  int domain = 0;
  int type = 0;
  socklen_t domain_size = sizeof domain;
  socklen_t type_size = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &domain_size) != 0 ||
      getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_size) != 0 || domain != AF_UNIX ||
      type != SOCK_STREAM) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "%s: socket_fd %d is not an AF_UNIX SOCK_STREAM socket", function, fd);
  }
  if ((flags & O_NONBLOCK) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "%s: socket_fd %d is non-blocking (O_NONBLOCK), and arcpool's IPC blocks on it "
                "(in Python, a socket with a timeout is non-blocking: sock.setblocking(True))",
                function, fd);
  }
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

arcpool_status_t arcpool_ipc_exporter_create(arcpool_allocator_t* allocator, int socket_fd,
                                             arcpool_ipc_exporter_t** out_exporter) {
  if (allocator == nullptr) return null_argument(__func__, "allocator");
  if (out_exporter == nullptr) return null_argument(__func__, "out_exporter");
  ARCPOOL_RETURN_IF_ERROR(check_socket(__func__, socket_fd));
  auto* handle = new (std::nothrow) arcpool_ipc_exporter{nullptr};
  if (handle == nullptr) return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory");
  if (arcpool_status_t status = exporter::create(allocator, socket_fd, &handle->impl);
      status != ARCPOOL_STATUS_SUCCESS) {
    delete handle;
    return status;
  }
  *out_exporter = handle;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t arcpool_ipc_send(arcpool_ipc_exporter_t* exporter,
                                  arcpool_allocation_t* allocation) {
  if (exporter == nullptr) return null_argument(__func__, "exporter");
  if (allocation == nullptr) return null_argument(__func__, "allocation");
  try {
    return exporter->impl->send(allocation);
  } catch (const std::bad_alloc&) {
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "arcpool_ipc_send: host memory exhausted");
  }
}

arcpool_status_t arcpool_ipc_exporter_outstanding(const arcpool_ipc_exporter_t* exporter,
                                                  size_t* out_count) {
  if (exporter == nullptr) return null_argument(__func__, "exporter");
  if (out_count == nullptr) return null_argument(__func__, "out_count");
  *out_count = exporter->impl->outstanding();
  return ARCPOOL_STATUS_SUCCESS;
}

void arcpool_ipc_exporter_destroy(arcpool_ipc_exporter_t* exporter) {
  if (exporter == nullptr) return;
  exporter->impl->destroy();
  delete exporter;
}

arcpool_status_t arcpool_ipc_importer_create(arcpool_allocator_t* allocator, int socket_fd,
                                             arcpool_ipc_importer_t** out_importer) {
  if (allocator == nullptr) return null_argument(__func__, "allocator");
  if (out_importer == nullptr) return null_argument(__func__, "out_importer");
  ARCPOOL_RETURN_IF_ERROR(check_socket(__func__, socket_fd));
  auto* handle = new (std::nothrow) arcpool_ipc_importer{nullptr};
  if (handle == nullptr) return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory");
  if (arcpool_status_t status = importer::create(allocator, socket_fd, &handle->impl);
      status != ARCPOOL_STATUS_SUCCESS) {
    delete handle;
    return status;
  }
  *out_importer = handle;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t arcpool_ipc_receive(arcpool_ipc_importer_t* importer, arcpool_stream_t stream,
                                     arcpool_allocation_t** out_allocation) {
  if (importer == nullptr) return null_argument(__func__, "importer");
  if (out_allocation == nullptr) return null_argument(__func__, "out_allocation");
  try {
    return importer->impl->receive(stream, out_allocation);
  } catch (const std::bad_alloc&) {
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "arcpool_ipc_receive: host memory exhausted");
  }
}

void arcpool_ipc_importer_destroy(arcpool_ipc_importer_t* importer) {
  if (importer == nullptr) return;
  importer->impl->destroy();
  delete importer;
}

}  // extern "C"
