#include "ipc/importer.hpp"

#include <unistd.h>

#include <cstdio>
#include <new>

#include "core/allocator.hpp"
#include "support/status.hpp"

namespace arcpool::detail::ipc {

importer::importer(arcpool_allocator_t* allocator, int fd)
    : allocator_(allocator),
      drv_(from_handle(allocator)->drv()),
      channel_(fd),
      events_(from_handle(allocator)->drv()) {}

importer::~importer() {
  // The release events the exporter has not acknowledged stay: it may still open them
  // (cudaIpcOpenEventHandle: "Performing operations on the imported event after the exported
  // event has been freed with cudaEventDestroy will result in undefined behavior"). They go
  // with the process; there is one per import still unacknowledged at the close.
  if (destroyed_) drain();  // allocations that arrived since the last read are refused
  if (free_stream_ != nullptr) drv_.stream_destroy(free_stream_);  // queued frees still run
  // cudaMemPoolDestroy returns at once; the pool goes once its imports are all freed.
  if (pool_ != nullptr) drv_.imported_pool_destroy(pool_);
}

arcpool_status_t importer::create(arcpool_allocator_t* allocator, int fd, importer** out) {
  if (const driver& d = from_handle(allocator)->drv(); d.kind() != ARCPOOL_DRIVER_CUDA) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "arcpool_ipc_importer_create: the %s driver shares no memory between processes "
                "(the CUDA driver does: design.md §14)",
                arcpool_driver_name(d.kind()));
  }
  ARCPOOL_RETURN_IF_ERROR(arcpool_allocator_retain(allocator));
  auto* im = new (std::nothrow) importer(allocator, fd);
  if (im == nullptr) {
    arcpool_allocator_destroy(allocator);
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an IPC importer");
  }
  message hello;
  hello.kind = message_kind::hello;
  hello.id = static_cast<uint64_t>(getpid());
  arcpool_status_t status = im->channel_.send(hello, -1, /*with_credentials=*/true);
  message pool;
  int pool_fd = -1;
  if (status == ARCPOOL_STATUS_SUCCESS) status = im->channel_.receive(&pool, &pool_fd);
  if (status == ARCPOOL_STATUS_SUCCESS && (pool.kind != message_kind::pool || pool_fd < 0)) {
    status = fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "arcpool_ipc_importer_create: the exporter sent no pool (message kind %u, "
                  "descriptor %d)",
                  static_cast<unsigned>(pool.kind), pool_fd);
  }
  if (status == ARCPOOL_STATUS_SUCCESS) status = im->drv_.pool_import_fd(pool_fd, &im->pool_);
  if (pool_fd >= 0) close(pool_fd);
  if (status == ARCPOOL_STATUS_SUCCESS) status = im->drv_.stream_create(&im->free_stream_);
  if (status != ARCPOOL_STATUS_SUCCESS) {
    im->channel_.release_fd();  // the caller keeps the socket on failure
    delete im;
    return status;
  }
  *out = im;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t importer::check_stream(arcpool_stream_t stream) {
  bool capturing = false;
  ARCPOOL_RETURN_IF_ERROR(drv_.stream_is_capturing(stream, &capturing));
  if (capturing) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "arcpool_ipc_receive: stream %p is capturing a CUDA graph: the wait on the "
                "exporter's event would cross the capture's boundary; receive outside the "
                "capture (the allocation stays queued)",
                static_cast<void*>(stream));
  }
  return from_handle(allocator_.get())->check_stream(stream);
}

arcpool_status_t importer::receive(arcpool_stream_t stream, arcpool_allocation_t** out) {
  // The first use's wait on the exporter's event is enqueued on `stream`. Made during a capture,
  // it would wait on a non-captured event from a capturing stream, which CUDA refuses (only
  // cudaEventWaitExternal's launch-time wait may cross a capture's boundary) and which breaks
  // the capture: refused, with nothing taken. Checked before waiting for an allocation, and
  // again once one is at hand, for a capture begun meanwhile. On the legacy default stream
  // while a blocking stream captures, the query itself fails (cudaErrorStreamCaptureImplicit).
  // So is a stream the import would refuse: by then the allocation would be taken, and its
  // claim given back.
  ARCPOOL_RETURN_IF_ERROR(check_stream(stream));
  // The importer stays while this call runs, also when another thread destroys it meanwhile
  // (arcpool_ipc_importer_destroy while this call waits for the exporter).
  refs_.fetch_add(1, std::memory_order_relaxed);
  struct unref_at_return {
    importer* im;
    ~unref_at_return() { im->unref(); }
  } held{this};
  message m;
  {
    // One reader at a time (drain only adds to pending_, and only when no reader reads); a
    // drain that ran before this may have left an allocation pending.
    std::lock_guard<std::mutex> reading(reading_mu_);
    for (;;) {
      bool pending = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (destroyed_) {
          return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                      "arcpool_ipc_receive: the importer was destroyed while this call waited; "
                      "what arrives from now on is refused to the exporter");
        }
        pending = !pending_.empty();
      }
      if (pending) {
        ARCPOOL_RETURN_IF_ERROR(check_stream(stream));
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_.empty()) continue;  // a destroy refused it meanwhile
        m = pending_.front();
        pending_.pop_front();
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (exporter_gone_) {
          return fail(ARCPOOL_STATUS_PEER_GONE,
                      "arcpool_ipc_receive: the exporter closed the connection (its process "
                      "exited or was killed, or it destroyed its side); nothing more will "
                      "arrive, and the imports received stay usable");
        }
      }
      message next;
      const arcpool_status_t status = channel_.receive(&next);
      if (status == ARCPOOL_STATUS_PEER_GONE) {
        std::lock_guard<std::mutex> lock(mu_);
        exporter_gone_ = true;
        continue;
      }
      ARCPOOL_RETURN_IF_ERROR(status);
      take(next);
    }
  }
  void* p = nullptr;
  if (const arcpool_status_t status = drv_.import_pointer(pool_, m.pointer, &p);
      status != ARCPOOL_STATUS_SUCCESS) {
    // Nothing was imported, so nothing here will use it: the exporter's claim may go now.
    refuse(m.id, /*may_block=*/true);
    return status;
  }
  // The first use waits on the exporter's event, recorded after its writes.
  event_handle e = nullptr;
  arcpool_status_t status = drv_.ipc_event_open(m.event, &e);
  if (status == ARCPOOL_STATUS_SUCCESS) {
    status = drv_.stream_wait_event(stream, e);
    drv_.event_destroy(e);
  }
  auto* ctx = new (std::nothrow) import_ctx{this, m.id};
  if (status == ARCPOOL_STATUS_SUCCESS && ctx == nullptr) {
    status = fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an import");
  }
  if (status != ARCPOOL_STATUS_SUCCESS) {
    delete ctx;
    release_import(p, m.id);
    return status;
  }
  refs_.fetch_add(1, std::memory_order_relaxed);
  // CONSUME: on_free runs exactly once, now if the import fails.
  return arcpool_import(allocator_.get(), p, m.size, stream, ARCPOOL_IMPORT_FLAG_CONSUME, &on_free,
                        ctx, out);
}

void importer::take(const message& m) noexcept {
  switch (m.kind) {
    case message_kind::event_done:
      recycle(m.id);
      break;
    case message_kind::goodbye: {
      std::lock_guard<std::mutex> lock(mu_);
      exporter_gone_ = true;
      break;
    }
    case message_kind::allocation: {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (destroyed_) {
          refuse(m.id, /*may_block=*/false);  // no receive will take it
          break;
        }
        try {
          pending_.push_back(m);
          break;
        } catch (const std::bad_alloc&) {
          // No host memory to queue it: refused below, as an import that failed.
        }
      }
      std::fprintf(stderr, "arcpool: IPC allocation %llu refused: no host memory to queue it\n",
                   static_cast<unsigned long long>(m.id));
      refuse(m.id, /*may_block=*/true);
      break;
    }
    default:
      break;  // nothing else comes from an exporter
  }
}

void importer::refuse(uint64_t id, bool may_block) noexcept {
  message refused;
  refused.kind = message_kind::refused;
  refused.id = id;
  // PEER_GONE: an exited exporter needs no word.
  if (may_block) {
    channel_.send(refused);
  } else if (!channel_.try_send(refused)) {
    std::fprintf(stderr,
                 "arcpool: IPC allocation %llu not refused (the socket is full, or another "
                 "thread is sending): the exporter keeps its claim until this process exits\n",
                 static_cast<unsigned long long>(id));
  }
}

void importer::destroy() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    destroyed_ = true;
  }
  drain();  // what has arrived: its allocations are refused as they are read
  std::deque<message> unreceived;
  {
    std::lock_guard<std::mutex> lock(mu_);
    unreceived.swap(pending_);
  }
  // Never blocks (arcpool_ipc_importer_destroy): a refusal the full socket cannot take now
  // leaves that claim to this process's exit, as before.
  for (const message& m : unreceived)
    refuse(m.id, /*may_block=*/false);
  unref();
}

void importer::drain() noexcept {
  std::unique_lock<std::mutex> reading(reading_mu_, std::try_to_lock);
  if (!reading.owns_lock()) return;  // a receive is reading, and takes what arrives
  while (channel_.readable()) {
    message m;
    if (channel_.receive(&m) != ARCPOOL_STATUS_SUCCESS) {
      std::lock_guard<std::mutex> lock(mu_);
      exporter_gone_ = true;  // end of file, or a broken connection: nothing more to read
      return;
    }
    take(m);
  }
}

void importer::on_free(void* p, size_t size, void* user_data) noexcept {
  (void)size;
  auto* ctx = static_cast<import_ctx*>(user_data);
  importer* im = ctx->owner;
  const uint64_t id = ctx->id;
  delete ctx;
  im->release_import(p, id);
  im->unref();
}

void importer::release_import(void* p, uint64_t id) noexcept {
  // cudaMemPoolImportPointer: "The imported memory must be freed from all importing processes
  // before being freed in the exporting process." arcpool's fences on it have all completed.
  drain();  // the exporter's acknowledgements first: their events are reused below
  arcpool_status_t status = drv_.imported_free(p, free_stream_);
  ipc_event_pool::entry e;
  if (status == ARCPOOL_STATUS_SUCCESS) status = events_.take(&e);
  if (status == ARCPOOL_STATUS_SUCCESS) {
    status = drv_.event_record(e.event, free_stream_);
    // Never sent, so no other process holds it: destroyed, not pooled (the record may have
    // failed because of the event itself, and the pool would hand it out next).
    if (status != ARCPOOL_STATUS_SUCCESS) drv_.event_destroy(e.event);
  }
  if (status != ARCPOOL_STATUS_SUCCESS) {
    // Untold, the exporter keeps its claim until this process exits: never an early free.
    std::fprintf(stderr, "arcpool: IPC import %llu not released to the exporter: %s\n",
                 static_cast<unsigned long long>(id), arcpool_last_error());
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      release_events_.emplace(id, e);
    } catch (const std::bad_alloc&) {
      // Not remembered, the event is never reused: it stays until the process exits, as an
      // unacknowledged one does (the exporter may still open it).
    }
  }
  message m;
  m.kind = message_kind::released;
  m.id = id;
  m.event = e.data;
  channel_.send(m);  // PEER_GONE: an exited exporter needs no word
}

void importer::recycle(uint64_t id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = release_events_.find(id);
  if (it == release_events_.end()) return;
  events_.give_back(it->second);
  release_events_.erase(it);
}

void importer::unref() noexcept {
  // The exporter reads the releases sent, then end of file.
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

}  // namespace arcpool::detail::ipc
