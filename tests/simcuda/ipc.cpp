// Pool memory and events shared between processes, the way the driver shares them: a pool's
// memory passes as a file descriptor (the device's memfd, sent over SCM_RIGHTS by the
// application), allocations as export data naming an offset in it, and interprocess events
// as shared memory. The memfd's tail holds the import table both processes map: which
// processes hold imports of which allocation, so that the exporter's free can be checked
// against cudaMemPoolImportPointer's rule. docs/simcuda.md, "Processes", says what is not
// modelled.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "state.hpp"

namespace simcuda {

/// One process's imports of one allocation.
struct ipc_holder {
  std::atomic<int32_t> pid;
  std::atomic<int32_t> count;
};

/// The importers of one exported allocation, keyed by its offset in the device memory + 1.
struct ipc_slot {
  std::atomic<uint64_t> key;
  ipc_holder holders[7];
};

constexpr uint64_t kTableMagic = 0x73696d6375646169;  // "simcudai"
constexpr size_t kSlots = 4096;

/// The import table of one device's memory.
struct ipc_table {
  uint64_t magic;
  uint64_t capacity;
  int64_t device;  ///< the device whose memory this is (simcuda numbers devices alike everywhere)
  ipc_slot slots[kSlots];
};

/// What other processes see of an interprocess event.
struct ipc_event_shared {
  uint64_t magic;
  uint64_t serial;                  ///< random: tells this event from a later one at its path
  int32_t creator;                  ///< the process that created the event
  std::atomic<uint32_t> destroyed;  ///< the creator destroyed it (cudaEventDestroy)
  std::atomic<uint64_t> recorded;   ///< records so far
  std::atomic<uint64_t> completed;  ///< the highest record whose work completed
};

namespace {

constexpr uint64_t kPointerMagic = 0x73696d6370747231;  // "simcptr1"
constexpr uint64_t kEventMagic = 0x73696d6365767431;    // "simcevt1"

/// cudaMemPoolPtrExportData as simcuda fills it.
struct pointer_data {
  uint64_t magic;
  uint64_t inode;   ///< the exporting device's memfd
  uint64_t offset;  ///< the allocation's offset in it
  uint64_t bytes;
};
static_assert(sizeof(pointer_data) <= sizeof(cudaMemPoolPtrExportData), "fits the export data");

/// cudaIpcEventHandle_t as simcuda fills it: the memfd, reopened through /proc.
struct event_data {
  uint64_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t serial;  ///< the event's (ipc_event_shared::serial)
};
static_assert(sizeof(event_data) <= sizeof(cudaIpcEventHandle_t), "fits the event handle");

/// Whether process `pid` is alive: it exists and is not a zombie (an exited process's
/// context, and its imports, are gone).
bool process_alive(int32_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return false;
  const char state = line[close_paren + 2];
  return state != 'Z' && state != 'X';
}

/// The slot of the allocation at `offset`, made if `create`; null when none (or full).
ipc_slot* slot_of(ipc_table& t, uint64_t offset, bool create) {
  const uint64_t key = offset + 1;
  for (size_t i = 0; i < kSlots; ++i) {
    ipc_slot& s = t.slots[(offset / 512 + i) % kSlots];
    uint64_t k = s.key.load();
    if (k == key) return &s;
    if (k == 0) {
      if (!create) return nullptr;
      if (s.key.compare_exchange_strong(k, key) || k == key) return &s;
    }
  }
  return nullptr;
}

void* map(int fd, size_t bytes, off_t offset, int prot) {
  void* p = mmap(nullptr, bytes, prot, MAP_SHARED | MAP_NORESERVE, fd, offset);
  return p == MAP_FAILED ? nullptr : p;
}

uint64_t inode_of(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

}  // namespace

size_t ipc_table_bytes() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (sizeof(ipc_table) + page - 1) / page * page;
}

void init_ipc_table(device_obj& d) {
  void* t = map(d.fd, ipc_table_bytes(), static_cast<off_t>(d.capacity), PROT_READ | PROT_WRITE);
  if (t == nullptr) {
    std::perror("simcuda: mmap of the IPC import table");
    std::abort();
  }
  d.ipc = static_cast<ipc_table*>(t);
  d.ipc->magic = kTableMagic;
  d.ipc->capacity = d.capacity;
  d.ipc->device = d.ordinal;
  d.inode = inode_of(d.fd);
}

const import_region* import_region_of(uintptr_t p) {
  const runtime& r = rt();
  const size_t n = r.region_count.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i)
    if (p >= r.regions[i].base && p < r.regions[i].base + r.regions[i].bytes) return &r.regions[i];
  return nullptr;
}

void check_no_live_imports(device_obj& d, uintptr_t base, const std::string& who) {
  ipc_slot* s = slot_of(*d.ipc, base - d.base, false);
  if (s == nullptr) return;
  for (ipc_holder& h : s->holders) {
    const int32_t pid = h.pid.load();
    const int32_t count = h.count.load();
    // cudaMemPoolImportPointer: "The imported memory must be freed from all importing
    // processes before being freed in the exporting process. [...] If cudaFreeAsync is used,
    // the free must be completed on the importing process before the free operation on the
    // exporting process."
    if (pid != 0 && count > 0 && process_alive(pid)) {
      violation(
          format("%s of %#lx in the exporting process executed while process %d still "
                 "held %d import(s) of it (its free had not completed)",
                 who.c_str(), static_cast<unsigned long>(base), pid, count));
    }
  }
}

void release_import(const pool_obj& pool, uintptr_t base) {
  const import_region& region = rt().regions[pool.region];
  ipc_slot* s = slot_of(*region.table, base - region.base, false);
  if (s == nullptr) return;
  const int32_t me = getpid();
  for (ipc_holder& h : s->holders)
    if (h.pid.load() == me && h.count.load() > 0) {
      h.count.fetch_sub(1);
      return;
    }
}

cudaError_t ipc_event_init(event_obj& e) {
  // driver_types.h, cudaEventInterprocess: "Event is suitable for interprocess use.
  // cudaEventDisableTiming must be set".
  if ((e.flags & cudaEventDisableTiming) == 0) return cudaErrorInvalidValue;
  e.shared_fd = memfd_create("simcuda-ipc-event", MFD_CLOEXEC);
  if (e.shared_fd < 0 || ftruncate(e.shared_fd, sizeof(ipc_event_shared)) != 0) {
    return cudaErrorMemoryAllocation;
  }
  e.shared = static_cast<ipc_event_shared*>(
      map(e.shared_fd, sizeof(ipc_event_shared), 0, PROT_READ | PROT_WRITE));
  if (e.shared == nullptr) return cudaErrorMemoryAllocation;
  e.shared->magic = kEventMagic;
  static std::atomic<uint64_t> count{0};
  e.shared->serial = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ ++count;
  e.shared->creator = getpid();
  return cudaSuccess;
}

void ipc_event_record(event_obj& e, op& o) {
  ipc_event_shared* shared = e.shared;
  const uint64_t record = shared->recorded.fetch_add(1) + 1;
  o.complete = [shared, record] {
    uint64_t seen = shared->completed.load();
    while (seen < record && !shared->completed.compare_exchange_weak(seen, record)) {
    }
  };
}

namespace {

/// Whether record `record` of `shared` has completed. A record of a process that died first
/// counts as complete (unverified: the Runtime API does not say what a wait on an exited
/// process's event does; its context, and the work it left, are gone).
bool ipc_record_done(const ipc_event_shared& shared, uint64_t record, bool check_creator) {
  if (shared.completed.load() >= record) return true;
  if (!check_creator || process_alive(shared.creator)) return false;
  // Printed as unverified() prints, without its counter: stream workers run this unlocked.
  std::fprintf(stderr,
               "simcuda warning (unverified rule): a wait on an interprocess event of process "
               "%d, which exited before the record completed, ends\n",
               shared.creator);
  return true;
}

/// Blocks until record `record` of `shared` has completed (or its process died).
void wait_for_record(const ipc_event_shared& shared, uint64_t record) {
  for (unsigned i = 0; !ipc_record_done(shared, record, i % 64 == 63); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

namespace {

/// cudaIpcOpenEventHandle: "Performing operations on the imported event after the exported
/// event has been freed with cudaEventDestroy will result in undefined behavior": a violation
/// (`call` is the operation).
void check_exported_event_alive(const event_obj& e, const char* call) {
  if (e.shared->destroyed.load() != 0) {
    violation(
        format("%s: an interprocess event opened from process %d, which destroyed it: "
               "undefined behavior (cudaIpcOpenEventHandle)",
               call, e.shared->creator));
  }
}

}  // namespace

void ipc_event_destroyed(event_obj& e) {
  if (!e.opened) e.shared->destroyed.store(1);
}

cudaError_t ipc_event_wait(stream_obj& s, event_obj& e) {
  check_exported_event_alive(e, "cudaStreamWaitEvent");
  // cudaStreamWaitEvent takes the event's most recent record as of the call; across processes
  // simcuda orders by the record count, not by vector clocks (the race checker stops at the
  // process boundary).
  if (s.capture != nullptr) {
    unverified("cudaStreamWaitEvent of an opened interprocess event during capture: refused");
    return cudaErrorStreamCaptureUnsupported;
  }
  ipc_event_shared* shared = e.shared;
  const uint64_t record = shared->recorded.load();
  auto o = std::make_unique<op>();
  o->what = "cudaStreamWaitEvent (interprocess)";
  o->run = [shared, record] { wait_for_record(*shared, record); };
  enqueue(s, std::move(o));
  return cudaSuccess;
}

cudaError_t ipc_event_query(const event_obj& e) {
  check_exported_event_alive(e, "cudaEventQuery");
  return ipc_record_done(*e.shared, e.shared->recorded.load(), true) ? cudaSuccess
                                                                     : cudaErrorNotReady;
}

void ipc_event_synchronize(std::unique_lock<std::mutex>& lock, const event_obj& e) {
  check_exported_event_alive(e, "cudaEventSynchronize");
  ipc_event_shared* shared = e.shared;
  const uint64_t record = shared->recorded.load();
  lock.unlock();
  wait_for_record(*shared, record);
  lock.lock();
}

}  // namespace simcuda

using namespace simcuda;

namespace {

pool_obj* find_pool(cudaMemPool_t handle, const char* call) {
  auto it = rt().pools.find(reinterpret_cast<uintptr_t>(handle));
  if (it == rt().pools.end() || it->second->destroyed) {
    violation(format("%s: %p is not a live memory pool", call, static_cast<void*>(handle)));
    return nullptr;
  }
  return it->second.get();
}

event_obj* find_event(cudaEvent_t handle, const char* call) {
  auto it = rt().events.find(reinterpret_cast<uintptr_t>(handle));
  if (it == rt().events.end() || it->second->destroyed) {
    violation(format("%s: %p is not a live event", call, static_cast<void*>(handle)));
    return nullptr;
  }
  return it->second.get();
}

}  // namespace

extern "C" {

cudaError_t cudaMemPoolExportToShareableHandle(void* handle_out, cudaMemPool_t handle,
                                               cudaMemAllocationHandleType type,
                                               unsigned int flags) {
  SIMCUDA_ENTER("cudaMemPoolExportToShareableHandle");
  check_unsafe_unverified("cudaMemPoolExportToShareableHandle");  // a pool call (CCCL)
  pool_obj* pool = find_pool(handle, "cudaMemPoolExportToShareableHandle");
  if (pool == nullptr || handle_out == nullptr || flags != 0) return ret(cudaErrorInvalidValue);
  // "To create an IPC capable mempool, create a mempool with a CUmemAllocationHandleType other
  // than cudaMemHandleTypeNone": a default pool (no handle types) and an imported pool are not.
  if (type != cudaMemHandleTypePosixFileDescriptor || (pool->handle_types & type) == 0 ||
      pool->imported) {
    return ret(cudaErrorInvalidValue);
  }
  const int fd = fcntl(r.devices[pool->device]->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ret(cudaErrorMemoryAllocation);
  *static_cast<int*>(handle_out) = fd;
  return cudaSuccess;
}

cudaError_t cudaMemPoolImportFromShareableHandle(cudaMemPool_t* pool_out, void* handle,
                                                 cudaMemAllocationHandleType type,
                                                 unsigned int flags) {
  SIMCUDA_ENTER("cudaMemPoolImportFromShareableHandle");
  check_unsafe_unverified("cudaMemPoolImportFromShareableHandle");  // makes a pool (CCCL)
  if (pool_out == nullptr || flags != 0 || type != cudaMemHandleTypePosixFileDescriptor) {
    return ret(cudaErrorInvalidValue);
  }
  const int fd = static_cast<int>(reinterpret_cast<intptr_t>(handle));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) <= ipc_table_bytes()) {
    return ret(cudaErrorInvalidValue);
  }
  const size_t bytes = static_cast<size_t>(st.st_size) - ipc_table_bytes();
  auto* table = static_cast<ipc_table*>(
      map(fd, ipc_table_bytes(), static_cast<off_t>(bytes), PROT_READ | PROT_WRITE));
  if (table == nullptr || table->magic != kTableMagic || table->capacity != bytes) {
    if (table != nullptr) munmap(table, ipc_table_bytes());
    return ret(cudaErrorInvalidValue);  // not a simcuda pool's descriptor
  }
  // The same memory as the exporter's device, mapped here as a device's own is. The pool
  // resides on that device, whichever is current here: "Imported memory pools are initially
  // only accessible from their resident device. The imported memory pool does not inherit any
  // accessibility set by the exporting process. The importing process needs to enable access
  // (with cudaMemPoolSetAccess) from any GPU it plans to access the memory from" (programming
  // guide, "Set Access in the Importing Process").
  if (device_at(static_cast<int>(table->device)) == nullptr) {
    munmap(table, ipc_table_bytes());
    return ret(cudaErrorInvalidValue);  // a device this process does not have
  }
  void* base = map(fd, bytes, 0, PROT_NONE);
  void* alias = map(fd, bytes, 0, PROT_READ | PROT_WRITE);
  if (base == nullptr || alias == nullptr) return ret(cudaErrorMemoryAllocation);
  context_device();
  auto pool = std::make_unique<pool_obj>();
  pool->handle = new_handle();
  pool->device = static_cast<int>(table->device);
  pool->imported = true;
  const size_t index = r.region_count.load(std::memory_order_relaxed);
  if (index == r.regions.size()) {
    munmap(base, bytes);
    munmap(alias, bytes);
    munmap(table, ipc_table_bytes());
    return ret(cudaErrorMemoryAllocation);  // simcuda maps at most 64 imported pools
  }
  pool->region = index;
  r.regions[index] = {reinterpret_cast<uintptr_t>(base), reinterpret_cast<uintptr_t>(alias), bytes,
                      table, static_cast<uint64_t>(st.st_ino)};
  r.region_count.store(index + 1, std::memory_order_release);
  *pool_out = reinterpret_cast<cudaMemPool_t>(pool->handle);
  r.pools.emplace(pool->handle, std::move(pool));
  return cudaSuccess;
}

cudaError_t cudaMemPoolExportPointer(cudaMemPoolPtrExportData* data, void* p) {
  SIMCUDA_ENTER("cudaMemPoolExportPointer");
  if (data == nullptr) return ret(cudaErrorInvalidValue);
  if (refuse_unsafe_call()) return ret(cudaErrorStreamCaptureUnsupported);  // see malloc_async
  auto it = r.live.find(reinterpret_cast<uintptr_t>(p));
  if (it == r.live.end() || it->second->pool == nullptr || it->second->pool->imported ||
      it->second->pool->handle_types == 0) {
    return ret(cudaErrorInvalidValue);  // "pointer to memory being exported" of a shared pool
  }
  const allocation& a = *it->second;
  const device_obj& d = *r.devices[a.pool->device];
  pointer_data out{kPointerMagic, d.inode, a.base - d.base, a.bytes};
  std::memset(data, 0, sizeof *data);
  std::memcpy(data, &out, sizeof out);
  return cudaSuccess;
}

cudaError_t cudaMemPoolImportPointer(void** out, cudaMemPool_t handle,
                                     cudaMemPoolPtrExportData* data) {
  SIMCUDA_ENTER("cudaMemPoolImportPointer");
  pool_obj* pool = find_pool(handle, "cudaMemPoolImportPointer");
  if (pool == nullptr || out == nullptr || data == nullptr || !pool->imported) {
    return ret(cudaErrorInvalidValue);
  }
  pointer_data in{};
  std::memcpy(&in, data, sizeof in);
  const import_region& region = r.regions[pool->region];
  if (in.magic != kPointerMagic || in.inode != region.inode || in.bytes == 0 ||
      in.offset + in.bytes > region.bytes) {
    return ret(cudaErrorInvalidValue);  // export data of another pool, or none
  }
  const uintptr_t base = region.base + in.offset;
  if (r.live.count(base) != 0) {
    unverified(
        "cudaMemPoolImportPointer of an allocation this process imported already: "
        "refused");
    return ret(cudaErrorInvalidValue);
  }
  ipc_slot* s = slot_of(*region.table, in.offset, true);
  if (s == nullptr) {
    violation("simcuda: the IPC import table is full (4096 exported allocations)");
    return ret(cudaErrorMemoryAllocation);
  }
  const int32_t me = getpid();
  ipc_holder* mine = nullptr;
  for (ipc_holder& h : s->holders) {
    int32_t pid = h.pid.load();
    if (pid == me ||
        ((pid == 0 || !process_alive(pid)) && h.pid.compare_exchange_strong(pid, me))) {
      if (pid != me) h.count.store(0);
      mine = &h;
      break;
    }
  }
  if (mine == nullptr) {
    violation("simcuda: more than 7 processes import one allocation");
    return ret(cudaErrorMemoryAllocation);
  }
  mine->count.fetch_add(1);
  auto a = std::make_unique<allocation>();
  a->base = base;
  a->bytes = in.bytes;
  a->pool = pool;
  a->alloc_what = "cudaMemPoolImportPointer";
  r.freed.erase(base);
  r.live[base] = std::move(a);
  *out = reinterpret_cast<void*>(base);
  return cudaSuccess;
}

cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t* handle, cudaEvent_t ev) {
  SIMCUDA_ENTER("cudaIpcGetEventHandle");
  event_obj* e = find_event(ev, "cudaIpcGetEventHandle");
  if (e == nullptr || handle == nullptr) return ret(cudaErrorInvalidValue);
  // "This event must have been created with the cudaEventInterprocess and
  // cudaEventDisableTiming flags set."
  if (e->shared == nullptr || e->opened) return ret(cudaErrorInvalidResourceHandle);
  event_data out{kEventMagic, getpid(), e->shared_fd, e->shared->serial};
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle, &out, sizeof out);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenEventHandle(cudaEvent_t* out, cudaIpcEventHandle_t handle) {
  SIMCUDA_ENTER("cudaIpcOpenEventHandle");
  if (out == nullptr) return ret(cudaErrorInvalidValue);
  event_data in{};
  std::memcpy(&in, &handle, sizeof in);
  if (in.magic != kEventMagic) return ret(cudaErrorInvalidValue);
  const std::string path = format("/proc/%d/fd/%d", in.pid, in.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ret(cudaErrorInvalidValue);  // the exporting process or event is gone
  auto* shared =
      static_cast<ipc_event_shared*>(map(fd, sizeof(ipc_event_shared), 0, PROT_READ | PROT_WRITE));
  close(fd);
  if (shared == nullptr || shared->magic != kEventMagic) return ret(cudaErrorInvalidValue);
  if (shared->serial != in.serial || shared->destroyed.load() != 0) {
    // The handle's event was destroyed, and its file descriptor number may name another event
    // now: undefined behavior (cudaIpcOpenEventHandle, above).
    violation(
        format("cudaIpcOpenEventHandle: the handle's event (process %d) was destroyed: "
               "undefined behavior",
               in.pid));
    return ret(cudaErrorInvalidValue);
  }
  context_device();
  // "This function returns a cudaEvent_t that behaves like a locally created event with the
  // cudaEventDisableTiming flag specified."
  auto e = std::make_unique<event_obj>();
  e->handle = new_handle();
  e->flags = cudaEventDisableTiming;
  e->shared = shared;
  e->opened = true;
  *out = reinterpret_cast<cudaEvent_t>(e->handle);
  r.events.emplace(e->handle, std::move(e));
  return cudaSuccess;
}

}  // extern "C"
