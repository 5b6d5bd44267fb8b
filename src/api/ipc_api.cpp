// The C API of arcpool/ipc.h: argument checks, then the exporter and importer (src/ipc/).
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

}  // namespace

extern "C" {

arcpool_status_t arcpool_ipc_exporter_create(arcpool_allocator_t* allocator, int socket_fd,
                                             arcpool_ipc_exporter_t** out_exporter) {
  if (allocator == nullptr) return null_argument(__func__, "allocator");
  if (out_exporter == nullptr) return null_argument(__func__, "out_exporter");
  if (socket_fd < 0) return bad_socket(__func__, socket_fd);
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
  if (socket_fd < 0) return bad_socket(__func__, socket_fd);
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
