#include <cstdlib>
#include <cstring>

#include "drivers/driver.hpp"
#include "support/status.hpp"

namespace arcpool::detail {

arcpool_status_t driver::stream_capture_info(stream_handle s, capture_info* out) {
  (void)out;
  return fail(ARCPOOL_STATUS_UNSUPPORTED, "stream %p: this driver captures no graphs",
              static_cast<void*>(s));
}

arcpool_status_t driver::graph_defer(void* graph, arcpool_host_fn_t fn, void* user_data) {
  (void)fn, (void)user_data;
  return fail(ARCPOOL_STATUS_UNSUPPORTED, "graph %p: this driver captures no graphs", graph);
}

namespace {

arcpool_status_t no_ipc(const driver& d, const char* what) {
  return fail(ARCPOOL_STATUS_UNSUPPORTED,
              "%s: the %s driver shares no memory between processes (the CUDA driver does: "
              "design.md §14)",
              what, arcpool_driver_name(d.kind()));
}

}  // namespace

arcpool_status_t driver::pool_export_fd(int* out) {
  (void)out;
  return no_ipc(*this, "pool export");
}

arcpool_status_t driver::pool_export_pointer(void* p, ipc_pointer_data* out) {
  (void)p, (void)out;
  return no_ipc(*this, "pointer export");
}

arcpool_status_t driver::ipc_event_create(event_handle* out, ipc_event_data* data) {
  (void)out, (void)data;
  return no_ipc(*this, "interprocess event");
}

arcpool_status_t driver::ipc_event_open(const ipc_event_data& data, event_handle* out) {
  (void)data, (void)out;
  return no_ipc(*this, "interprocess event");
}

arcpool_status_t driver::pool_import_fd(int fd, imported_pool* out) {
  (void)fd, (void)out;
  return no_ipc(*this, "pool import");
}

arcpool_status_t driver::import_pointer(imported_pool pool, const ipc_pointer_data& data,
                                        void** out) {
  (void)pool, (void)data, (void)out;
  return no_ipc(*this, "pointer import");
}

arcpool_status_t driver::imported_free(void* p, stream_handle s) {
  (void)p, (void)s;
  return no_ipc(*this, "imported free");
}

arcpool_driver_kind_t resolve_auto_driver(bool* from_environment) {
  if (const char* env = std::getenv("ARCPOOL_DRIVER"); env != nullptr && *env != '\0') {
    if (from_environment != nullptr) *from_environment = true;
    if (std::strcmp(env, "cuda") == 0) return ARCPOOL_DRIVER_CUDA;
    if (std::strcmp(env, "host") == 0) return ARCPOOL_DRIVER_HOST;
    fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "ARCPOOL_DRIVER=%s: expected 'cuda' or 'host'", env);
    return ARCPOOL_DRIVER_AUTO;
  }
  return cuda_any_device_usable() ? ARCPOOL_DRIVER_CUDA : ARCPOOL_DRIVER_HOST;
}

arcpool_status_t make_driver(const driver_config& config, std::unique_ptr<driver>* out) {
  arcpool_driver_kind_t kind = config.kind;
  bool from_environment = false;
  if (kind == ARCPOOL_DRIVER_AUTO) {
    kind = resolve_auto_driver(&from_environment);
    if (kind == ARCPOOL_DRIVER_AUTO) return ARCPOOL_STATUS_INVALID_ARGUMENT;  // with its message
  }
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  switch (kind) {
    case ARCPOOL_DRIVER_CUDA:
      *out = make_cuda_driver(config, &status);
      break;
    case ARCPOOL_DRIVER_HOST:
      if (config.host_deterministic_seed != 0) {
        *out = make_deterministic_driver(config);
      } else {
        *out = make_host_driver(config, &status);
      }
      break;
    case ARCPOOL_DRIVER_NULL:
      *out = make_null_driver(config);
      break;
    default:
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "unknown driver kind %d",
                  static_cast<int>(kind));
  }
  if (status != ARCPOOL_STATUS_SUCCESS && from_environment) {
    append_to_last_error(" (driver chosen by ARCPOOL_DRIVER)");
  }
  return status;
}

}  // namespace arcpool::detail
