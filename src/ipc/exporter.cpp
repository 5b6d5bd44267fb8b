#include "ipc/exporter.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <thread>

#include "core/allocation.hpp"
#include "core/allocator.hpp"
#include "support/process_exit.hpp"
#include "support/status.hpp"

namespace arcpool::detail::ipc {

exporter::exporter(arcpool_allocator_t* allocator, int fd, arcpool_stream_t watch_stream,
                   arcpool_stream_t send_stream)
    : allocator_(allocator),
      drv_(from_handle(allocator)->drv()),
      channel_(fd),
      events_(from_handle(allocator)->drv()),
      watch_stream_(watch_stream),
      send_stream_(send_stream) {}

exporter::~exporter() {
  arcpool_stream_destroy(allocator_.get(), watch_stream_);
  arcpool_stream_destroy(allocator_.get(), send_stream_);
}

arcpool_status_t exporter::create(arcpool_allocator_t* allocator, int fd, exporter** out) {
  int pool_fd = -1;
  ARCPOOL_RETURN_IF_ERROR(from_handle(allocator)->drv().pool_export_fd(&pool_fd));
  arcpool_stream_t watch_stream = nullptr, send_stream = nullptr;
  auto destroy_streams = [&] {
    if (watch_stream != nullptr) arcpool_stream_destroy(allocator, watch_stream);
    if (send_stream != nullptr) arcpool_stream_destroy(allocator, send_stream);
  };
  arcpool_status_t status = arcpool_stream_create(allocator, &watch_stream);
  if (status == ARCPOOL_STATUS_SUCCESS) status = arcpool_stream_create(allocator, &send_stream);
  if (status == ARCPOOL_STATUS_SUCCESS) status = arcpool_allocator_retain(allocator);
  if (status != ARCPOOL_STATUS_SUCCESS) {
    destroy_streams();
    close(pool_fd);
    return status;
  }
  auto* e = new (std::nothrow) exporter(allocator, fd, watch_stream, send_stream);
  if (e == nullptr) {
    close(pool_fd);
    destroy_streams();
    arcpool_allocator_destroy(allocator);
    return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "no host memory for an IPC exporter");
  }
  // The importer greets first, then gets the pool. Its process, whose exit ends its claims, is
  // the one the kernel names (SCM_CREDENTIALS, in this process's PID namespace), never the id
  // the greeting carries: in another PID namespace that number names another process here.
  message hello;
  pid_t importer = 0;
  status = e->channel_.receive_with_sender(&hello, &importer);
  if (status == ARCPOOL_STATUS_SUCCESS && hello.kind != message_kind::hello) {
    status = fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "arcpool_ipc_exporter_create: the other end did not greet as an importer "
                  "(message kind %u)",
                  static_cast<unsigned>(hello.kind));
  }
  if (status == ARCPOOL_STATUS_SUCCESS && importer <= 0) {
    status = fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "arcpool_ipc_exporter_create: the kernel names no process for the importer "
                  "(its greeting came without credentials, or its process is in a PID "
                  "namespace this process cannot see), so its exit could not end its claims: "
                  "run both processes in one PID namespace");
  }
  if (status == ARCPOOL_STATUS_SUCCESS) {
    e->importer_pid_ = importer;
    message pool;
    pool.kind = message_kind::pool;
    status = e->channel_.send(pool, pool_fd);
  }
  close(pool_fd);
  if (status == ARCPOOL_STATUS_SUCCESS) {
    try {
      std::thread([e] { e->watch(); }).detach();
    } catch (const std::exception&) {  // std::system_error, or std::bad_alloc for its state
      status = fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
                    "no thread, or no host memory, for the IPC exporter's watcher");
    }
  }
  if (status != ARCPOOL_STATUS_SUCCESS) {
    e->channel_.release_fd();  // the caller keeps the socket on failure
    delete e;
    return status;
  }
  *out = e;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t exporter::send(arcpool_allocation_t* a) {
  // The send's own reference: a destroy while it runs (blocked on a full socket, say) and the
  // watcher's end leave the exporter to the send, which deletes it if it is the last.
  refs_.fetch_add(1, std::memory_order_relaxed);
  struct unref_at_exit {
    exporter* self;
    ~unref_at_exit() { self->unref(); }
  } held{this};
  allocation& record = *a->record;
  if (&record.owner != from_handle(allocator_.get())) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "arcpool_ipc_send: the allocation is not of the exporter's allocator");
  }
  arcpool_placement_t placement{};
  placement.struct_size = sizeof placement;
  placement.version = ARCPOOL_PLACEMENT_VERSION;
  ARCPOOL_RETURN_IF_ERROR(arcpool_allocation_placement(a, &placement));
  constexpr uint32_t kNotPool = ARCPOOL_PLACEMENT_FLAG_EXTERNAL | ARCPOOL_PLACEMENT_FLAG_GRAPH |
                                ARCPOOL_PLACEMENT_FLAG_GRAPH_POOL;
  if (a->is_view || (placement.flags & kNotPool) != 0 || placement.alignment > 256 ||
      placement.size == 0) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "arcpool_ipc_send: only a whole, nonempty pool allocation aligned to at most "
                "256 bytes can be shared (a view, an import, graph memory or a larger "
                "alignment cannot: the data pointer must be the pool's)");
  }
  void* data = nullptr;
  ARCPOOL_RETURN_IF_ERROR(arcpool_allocation_data(a, &data));
  message m;
  m.kind = message_kind::allocation;
  m.size = placement.size;
  // The importer's first use waits on this event, recorded after the work queued so far on
  // every stream the allocation may be used on, its writes included (cudaMemPoolImportPointer:
  // "The imported memory must not be accessed before the allocation operation completes in the
  // exporting process"): on its current stream, or on the send stream once that waited on them
  // all. Recorded during a capture, a fence would be a node of the graph, which runs later and
  // at every launch, not a record of the work queued so far: refused then, as for a current
  // stream no fence taken here covers. Refused before the export, which a capture on this
  // thread would break (bench/results/2026-12-04-h200).
  sent s{a, {}};
  ARCPOOL_RETURN_IF_ERROR(events_.take(&s.event));
  arcpool_status_t status = ARCPOOL_STATUS_SUCCESS;
  try {
    status =
        record.owner.record_after_uses(record, s.event.event, send_stream_, "arcpool_ipc_send");
  } catch (const std::bad_alloc&) {  // fencing the uses allocates; OUT_OF_MEMORY, nothing kept
    events_.give_back(s.event);
    throw;
  }
  if (status == ARCPOOL_STATUS_SUCCESS) status = drv_.pool_export_pointer(data, &m.pointer);
  if (status == ARCPOOL_STATUS_SUCCESS) status = arcpool_allocation_preserve(a);
  if (status != ARCPOOL_STATUS_SUCCESS) {
    events_.give_back(s.event);
    return status;
  }
  arcpool_allocation_retain(a);
  m.event = s.event.data;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (destroyed_) {
      status =
          fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "arcpool_ipc_send: the exporter was destroyed");
    } else if (already_sent_locked(record)) {
      // The importer would import it twice (cudaMemPoolImportPointer) into one mapping, whose
      // first free unmaps what the second import still uses; CUDA documents no second import.
      // Named without allocating: a throw here would keep the claim taken above.
      status = fail(ARCPOOL_STATUS_UNSUPPORTED,
                    "arcpool_ipc_send: allocation #%llu (%zu bytes at %p) was already sent to "
                    "this importer, which has not released it yet",
                    static_cast<unsigned long long>(record.placement.serial), placement.size, data);
    } else {
      try {
        sent_.emplace(next_id_, s);
        m.id = next_id_++;
      } catch (const std::bad_alloc&) {
        status = fail(ARCPOOL_STATUS_OUT_OF_MEMORY,
                      "arcpool_ipc_send: no host memory to record the allocation sent");
      }
    }
  }
  if (status == ARCPOOL_STATUS_SUCCESS) status = channel_.send(m);
  if (status != ARCPOOL_STATUS_SUCCESS) {
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine = sent_.erase(m.id) == 1 || m.id == 0;
    }
    if (mine) drop(s);  // the importer never got it; a released one was the watcher's to drop
    return status;
  }
  return ARCPOOL_STATUS_SUCCESS;
}

bool exporter::already_sent_locked(const allocation& record) const {
  for (const auto& entry : sent_) {
    if (entry.second.allocation->record == &record) return true;
  }
  return false;
}

size_t exporter::outstanding() {
  std::lock_guard<std::mutex> lock(mu_);
  return sent_.size();
}

void exporter::destroy() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    destroyed_ = true;
  }
  message bye;
  bye.kind = message_kind::goodbye;
  // Never blocks: when the goodbye cannot be written now (the importer is not reading, or a
  // send is under way), the end of the exporter's side says the same, after what was sent.
  if (!channel_.try_send(bye)) channel_.shut_down_sending();
  unref();
}

void exporter::watch() noexcept {
  message m;
  while (channel_.receive(&m) == ARCPOOL_STATUS_SUCCESS) {
    if (m.kind == message_kind::refused) {
      refused(m.id);
      continue;
    }
    if (m.kind != message_kind::released) continue;
    if (!release_after(m.id, m.event)) continue;
    message done;
    done.kind = message_kind::event_done;
    done.id = m.id;
    // Never blocks the watcher, which must go on reading the importer's releases: an
    // acknowledgement that cannot be written now is left out, and the importer keeps that one
    // event until it closes.
    channel_.try_send(done);
  }
  // End of file: the importer closed its side or its process died. A closing importer has
  // released everything first; a dead one may have held imports, which are freed once its
  // process has exited (its context, and its use of the memory, end with it).
  channel_.shut_down_sending();  // a closing importer waits for this end of file
  wait_for_importer_exit();
  if (process_exiting()) return;  // the process gives everything back
  // One at a time, so that the watcher allocates nothing for them.
  for (;;) {
    sent s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (sent_.empty()) break;
      const auto it = sent_.begin();
      s = it->second;
      sent_.erase(it);
    }
    drop(s);
  }
  unref();
}

bool exporter::release_after(uint64_t id, const ipc_event_data& importer_event) noexcept {
  sent s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sent_.find(id);
    if (it == sent_.end()) return false;  // not ours: nothing to release
    s = it->second;
  }
  // cudaMemPoolImportPointer: "If cudaFreeAsync is used, the free must be completed on the
  // importing process before the free operation on the exporting process", and the exporting
  // free may be queued early "as long as [it] specifies a stream with a stream dependency on
  // the importing process's cudaFreeAsync". The importer's event follows its free; the watch
  // stream waits on it and becomes a use of the allocation, which every free waits on.
  event_handle e = nullptr;
  if (drv_.ipc_event_open(importer_event, &e) != ARCPOOL_STATUS_SUCCESS) {
    std::fprintf(stderr, "arcpool: IPC release of import %llu kept until the importer exits: %s\n",
                 static_cast<unsigned long long>(id), arcpool_last_error());
    return false;
  }
  const arcpool_status_t waited = drv_.stream_wait_event(watch_stream_, e);
  drv_.event_destroy(e);
  if (waited != ARCPOOL_STATUS_SUCCESS ||
      arcpool_record_use(s.allocation, watch_stream_) != ARCPOOL_STATUS_SUCCESS) {
    std::fprintf(stderr, "arcpool: IPC release of import %llu kept until the importer exits: %s\n",
                 static_cast<unsigned long long>(id), arcpool_last_error());
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    sent_.erase(id);
  }
  drop(s);
  return true;
}

void exporter::refused(uint64_t id) noexcept {
  sent s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sent_.find(id);
    if (it == sent_.end()) return;
    s = it->second;
    sent_.erase(it);
  }
  drop(s);  // never imported: no use over there to wait for
}

void exporter::wait_for_importer_exit() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sent_.empty()) return;
  }
  if (importer_pid_ == getpid()) return;  // an importer in this process: nothing to wait for
  // pidfd_open (Linux 5.3): "the file descriptor becomes readable when the process terminates".
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, importer_pid_, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    close(pidfd);
    return;
  }
  if (errno == ESRCH) return;  // gone already
  // No pidfd (ENOSYS before Linux 5.3, as on RHEL 8's 4.18; EMFILE; a seccomp filter): the
  // importer may live on and use its imports, so its claims stay until it is seen gone. Should
  // its pid be reused meanwhile, they stay longer, never shorter.
  while (process_running(importer_pid_)) {
    std::this_thread::sleep_for(kExitPoll);
  }
}

bool exporter::process_running(pid_t pid) noexcept {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A zombie (terminated, not reaped yet: state Z or X after the command name in
  // /proc/PID/stat, proc(5)) no longer runs, as a pidfd would say.
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "re");
  if (f == nullptr) return true;  // no /proc: kill's answer stands
  char stat[512];
  const size_t n = std::fread(stat, 1, sizeof stat - 1, f);
  std::fclose(f);
  stat[n] = '\0';
  const char* end_of_name = std::strrchr(stat, ')');
  if (end_of_name == nullptr || end_of_name[1] != ' ') return true;
  return end_of_name[2] != 'Z' && end_of_name[2] != 'X';
}

void exporter::drop(const sent& s) noexcept {
  events_.give_back(s.event);
  arcpool_allocation_discard_and_release(s.allocation);
}

void exporter::unref() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
}

}  // namespace arcpool::detail::ipc
