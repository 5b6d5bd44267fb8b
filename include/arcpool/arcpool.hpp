// arcpool — C++ API: inline, header-only wrappers over the C ABI (arcpool.h), so no C++ type
// crosses the shared library's boundary.
//
// Ordering contract: as arcpool.h. `_async` members are stream-ordered and never block the
// host; members without the suffix either touch no stream or say that they block.
// Errors: members throw arcpool::error, except for OUT_OF_MEMORY: arcpool::out_of_memory, a
// std::bad_alloc as operator new throws (catch std::exception for both). Destructors never
// throw and never fail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "arcpool/arcpool.h"

namespace arcpool {

/// A stream: a cudaStream_t (or a host-driver stream).
using stream_t = arcpool_stream_t;

/// A failed arcpool call: the status and the message arcpool_last_error() gave.
class error : public std::runtime_error {
 public:
  error(arcpool_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  /// The C status.
  arcpool_status_t status() const noexcept { return status_; }

 private:
  arcpool_status_t status_;
};

/// OUT_OF_MEMORY: the message names the bytes and the pool's figures. A std::bad_alloc, not an
/// arcpool::error (one class cannot be both without making std::exception ambiguous).
class out_of_memory : public std::bad_alloc {
 public:
  explicit out_of_memory(std::string message) : message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  /// ARCPOOL_STATUS_OUT_OF_MEMORY, as arcpool::error::status() would say.
  arcpool_status_t status() const noexcept { return ARCPOOL_STATUS_OUT_OF_MEMORY; }

 private:
  std::string message_;
};

namespace detail {
/// Throws the exception for a failed `status`, with the calling thread's last error.
[[noreturn]] inline void throw_status(arcpool_status_t status) {
  std::string message = arcpool_last_error();
  if (message.empty()) message = arcpool_status_string(status);
  if (status == ARCPOOL_STATUS_OUT_OF_MEMORY) throw out_of_memory(message);
  throw error(status, message);
}
/// Throws unless `status` is success.
inline void check(arcpool_status_t status) {
  if (status != ARCPOOL_STATUS_SUCCESS) throw_status(status);
}
/// A free of `p` whose failure a noexcept deallocation cannot throw (a CCCL resource's, a Thrust
/// allocator's): written to stderr with arcpool's reason, as arcpool's PyTorch and RMM drop-ins
/// write theirs, so that a refused free (UNSUPPORTED during a capture, UNKNOWN_POINTER twice)
/// is not lost without a word.
inline void report_failed_free(arcpool_status_t status, const void* p) noexcept {
  if (status != ARCPOOL_STATUS_SUCCESS) {
    std::fprintf(stderr, "arcpool: free of %p failed: %s\n", p, arcpool_last_error());
  }
}
}  // namespace detail

/// Options of an allocator, initialized to the documented defaults.
struct allocator_options : arcpool_allocator_options_t {
  allocator_options() noexcept { arcpool_allocator_options_init(this); }
};

/// A view of part of an allocation: one reference, no claim. Move-only.
class buffer_view {
 public:
  buffer_view() noexcept = default;
  /// Adopts a view handle (its reference).
  explicit buffer_view(arcpool_allocation_t* handle) noexcept : handle_(handle) {}
  buffer_view(buffer_view&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  buffer_view& operator=(buffer_view&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~buffer_view() { arcpool_allocation_release(handle_); }

  /// First byte of the view. Throws ALREADY_DEALLOCATED once the allocation is gone.
  void* data() const {
    void* p = nullptr;
    detail::check(arcpool_allocation_data(handle_, &p));
    return p;
  }
  /// Bytes of the view.
  size_t size() const noexcept { return arcpool_allocation_size(handle_); }
  /// The C handle (borrowed).
  arcpool_allocation_t* get() const noexcept { return handle_; }

 private:
  arcpool_allocation_t* handle_ = nullptr;
};

class shared_buffer;

/// Common members of buffer and shared_buffer: one claim and one reference on an allocation.
/// Not copyable as itself: a copy through a base reference would share the handle without its
/// claim and reference, and release them twice.
class buffer_base {
 public:
  buffer_base(const buffer_base&) = delete;
  buffer_base& operator=(const buffer_base&) = delete;

  /// First byte (NULL for zero bytes).
  void* data() const {
    void* p = nullptr;
    detail::check(arcpool_allocation_data(handle_, &p));
    return p;
  }
  /// Requested bytes.
  size_t size() const noexcept { return arcpool_allocation_size(handle_); }
  /// True while the handle holds an allocation.
  explicit operator bool() const noexcept { return handle_ != nullptr; }
  /// True if this is the only owner (the memory may be reused in place after transfer_to).
  bool is_terminal() const noexcept { return arcpool_allocation_is_terminal(handle_) != 0; }
  /// The C handle (borrowed).
  arcpool_allocation_t* get() const noexcept { return handle_; }

  /// Hands the allocation to `s` with fences (arcpool_transfer). Never blocks.
  void transfer_to(stream_t s) { detail::check(arcpool_transfer(handle_, s)); }
  /// Records that `s` also uses the allocation (arcpool_record_use_with_flags; `flags` from
  /// arcpool_record_use_flags_t). Never blocks.
  void record_use(stream_t s, uint32_t flags = 0) {
    detail::check(arcpool_record_use_with_flags(handle_, s, flags));
  }
  /// A view of bytes [offset, offset + n). Holds a reference, no claim.
  buffer_view view(size_t offset, size_t n) const {
    arcpool_allocation_t* v = nullptr;
    detail::check(arcpool_allocation_view(handle_, offset, n, &v));
    return buffer_view(v);
  }
  /// Placement (origin stream, flags, ...).
  arcpool_placement_t placement() const {
    arcpool_placement_t p{};
    p.struct_size = sizeof(p);
    p.version = ARCPOOL_PLACEMENT_VERSION;
    detail::check(arcpool_allocation_placement(handle_, &p));
    return p;
  }

  /// Deallocates on `s` (arcpool_deallocate_async) and gives up the handle. Throws NOT_OWNER
  /// while other owners remain (unless FORCE); the handle is kept on failure. Never blocks.
  void deallocate_async(stream_t s, uint32_t flags = 0) {
    detail::check(arcpool_deallocate_async(handle_, s, flags));
    arcpool_allocation_release(std::exchange(handle_, nullptr));
  }

  /// Drops the claim and the reference (deallocating on the current stream if the claim was
  /// the last). Never throws.
  void reset() noexcept {
    if (handle_ != nullptr) arcpool_allocation_discard_and_release(std::exchange(handle_, nullptr));
  }

 protected:
  buffer_base() noexcept = default;
  explicit buffer_base(arcpool_allocation_t* handle) noexcept : handle_(handle) {}
  ~buffer_base() { reset(); }

  arcpool_allocation_t* handle_ = nullptr;
};

/// The sole claim on an allocation, like std::unique_ptr. Destroying it deallocates on the
/// allocation's current stream. Move-only.
class buffer : public buffer_base {
 public:
  buffer() noexcept = default;
  /// Adopts a handle holding one claim and one reference.
  explicit buffer(arcpool_allocation_t* handle) noexcept : buffer_base(handle) {}
  buffer(buffer&& other) noexcept : buffer_base(std::exchange(other.handle_, nullptr)) {}
  buffer& operator=(buffer&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  /// Turns the claim into a copyable shared one.
  shared_buffer share() &&;

  /// Exports the memory as a raw pointer the caller now frees (arcpool_allocation_export).
  void* export_pointer() && {
    void* p = nullptr;
    detail::check(arcpool_allocation_export(handle_, &p));
    arcpool_allocation_release(std::exchange(handle_, nullptr));
    return p;
  }

  /// Gives up the handle (its claim and reference) to the caller.
  arcpool_allocation_t* detach() noexcept { return std::exchange(handle_, nullptr); }
};

/// One of several claims on an allocation, like std::shared_ptr: a copy is a preserve.
/// Whichever drops the last claim deallocates on the current stream.
class shared_buffer : public buffer_base {
 public:
  shared_buffer() noexcept = default;
  /// Adopts a handle holding one claim and one reference.
  explicit shared_buffer(arcpool_allocation_t* handle) noexcept : buffer_base(handle) {}
  /// Adds a claim (preserve) and a reference. Throws if the allocation was force-deallocated.
  shared_buffer(const shared_buffer& other) : buffer_base() {
    if (other.handle_ != nullptr) {
      detail::check(arcpool_allocation_preserve(other.handle_));
      arcpool_allocation_retain(other.handle_);
      handle_ = other.handle_;
    }
  }
  shared_buffer(shared_buffer&& other) noexcept
      : buffer_base(std::exchange(other.handle_, nullptr)) {}
  shared_buffer& operator=(shared_buffer other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
};

inline shared_buffer buffer::share() && {
  return shared_buffer(detach());
}

/// A stream created by an allocator (a non-blocking cudaStream_t, or a host worker), which
/// arcpool knows to be alive until this object is destroyed. It must not outlive the allocator
/// object that created it. Move-only.
class stream {
 public:
  stream() noexcept = default;
  /// Adopts `handle`, created by `allocator`, which it keeps alive (a reference) until the
  /// stream is destroyed: members may be destroyed in any order.
  stream(arcpool_allocator_t* allocator, stream_t handle) noexcept
      : allocator_(allocator), handle_(handle) {
    arcpool_allocator_retain(allocator_);
  }
  stream(stream&& other) noexcept
      : allocator_(std::exchange(other.allocator_, nullptr)),
        handle_(std::exchange(other.handle_, nullptr)) {}
  stream& operator=(stream&& other) noexcept {
    std::swap(allocator_, other.allocator_);
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~stream() {
    if (allocator_ != nullptr) {
      arcpool_stream_destroy(allocator_, handle_);
      arcpool_allocator_destroy(allocator_);
    }
  }
  /// The stream handle (a cudaStream_t on the CUDA driver).
  stream_t get() const noexcept { return handle_; }
  operator stream_t() const noexcept { return handle_; }
  /// Blocks until the stream's work has completed.
  void synchronize() const { detail::check(arcpool_stream_synchronize(allocator_, handle_)); }

 private:
  arcpool_allocator_t* allocator_ = nullptr;
  stream_t handle_ = nullptr;
};

/// A graph pool (arcpool_graph_pool_create): memory lent only to the captures bound to it.
/// Move-only; the destructor releases the handle's reference.
class graph_pool {
 public:
  graph_pool() noexcept = default;
  /// Creates a pool of `allocator` (the CUDA driver).
  explicit graph_pool(arcpool_allocator_t* allocator) {
    detail::check(arcpool_graph_pool_create(allocator, &handle_));
  }
  graph_pool(graph_pool&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  graph_pool& operator=(graph_pool&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~graph_pool() { arcpool_graph_pool_release(handle_); }

  /// The C handle (borrowed).
  arcpool_graph_pool_t* get() const noexcept { return handle_; }
  /// Binds the capture `s` records into (arcpool_graph_pool_begin).
  void begin(stream_t s) { detail::check(arcpool_graph_pool_begin(handle_, s)); }
  /// Unbinds the captures begun on `s` (arcpool_graph_pool_end).
  void end(stream_t s) { detail::check(arcpool_graph_pool_end(handle_, s)); }

 private:
  arcpool_graph_pool_t* handle_ = nullptr;
};

/// An allocator for one device. Owns its C handle; live buffers keep the underlying allocator
/// alive after this object is gone. Move-only.
class allocator {
 public:
  /// Default options (device 0, AUTO driver).
  allocator() : allocator(allocator_options{}) {}
  explicit allocator(const arcpool_allocator_options_t& options) {
    detail::check(arcpool_allocator_create(&options, &handle_));
  }
  allocator(allocator&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  allocator& operator=(allocator&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~allocator() { arcpool_allocator_destroy(handle_); }

  /// The C handle (borrowed).
  arcpool_allocator_t* get() const noexcept { return handle_; }
  /// The driver serving it (CUDA or HOST).
  arcpool_driver_kind_t driver() const noexcept { return arcpool_allocator_driver(handle_); }
  /// The device ordinal.
  int device() const noexcept { return arcpool_allocator_device(handle_); }

  /// Allocates `bytes` on `s` (arcpool_allocate_async). Never blocks (except when out of
  /// memory). Throws out_of_memory.
  buffer allocate_async(size_t bytes, stream_t s, size_t alignment = 0, uint32_t flags = 0) {
    arcpool_allocation_t* h = nullptr;
    detail::check(arcpool_allocate_async(handle_, bytes, alignment, s, flags, &h));
    return buffer(h);
  }

  /// Wraps foreign memory (arcpool_import).
  buffer import(void* pointer, size_t bytes, stream_t s, uint32_t flags, arcpool_on_free_t on_free,
                void* user_data) {
    arcpool_allocation_t* h = nullptr;
    detail::check(arcpool_import(handle_, pointer, bytes, s, flags, on_free, user_data, &h));
    return buffer(h);
  }

  /// Creates a stream arcpool knows alive until the returned object is destroyed.
  stream create_stream() {
    stream_t s = nullptr;
    detail::check(arcpool_stream_create(handle_, &s));
    return stream(handle_, s);
  }
  /// See arcpool_stream_register.
  void register_stream(stream_t s) { detail::check(arcpool_stream_register(handle_, s)); }
  /// See arcpool_stream_unregister.
  void unregister_stream(stream_t s) { detail::check(arcpool_stream_unregister(handle_, s)); }
  /// Blocks until `s`'s work has completed.
  void synchronize(stream_t s) { detail::check(arcpool_stream_synchronize(handle_, s)); }

  /// Statistics.
  arcpool_stats_t stats() const {
    arcpool_stats_t s{};
    s.struct_size = sizeof(s);
    s.version = ARCPOOL_STATS_VERSION;
    detail::check(arcpool_stats_get(handle_, &s));
    return s;
  }
  /// Statistics as a JSON object, whole.
  std::string stats_json() const {
    size_t length = 0;
    detail::check(arcpool_stats_json(handle_, nullptr, 0, &length));
    // A figure that gains a digit, or a new stream's row, makes it longer between the calls:
    // the copy is then cut short (the full length reported), and taken again with more room.
    for (;;) {
      std::string json(length + length / 4 + 256, '\0');
      detail::check(arcpool_stats_json(handle_, json.data(), json.size(), &length));
      if (length < json.size()) {
        json.resize(length);
        return json;
      }
    }
  }
  /// Statistics per stream: a row per stream with one of its own, then the other-streams row.
  std::vector<arcpool_stream_stats_t> stream_stats() const {
    std::vector<arcpool_stream_stats_t> rows(ARCPOOL_STREAM_STATS_ROWS + 1);
    size_t count = 0;
    detail::check(
        arcpool_stream_stats_list(handle_, rows.data(), sizeof(rows[0]), rows.size(), &count));
    rows.resize(count < rows.size() ? count : rows.size());
    return rows;
  }
  /// The memory snapshot in PyTorch's pickle format (arcpool_memory_snapshot); throws when the
  /// allocator records no history.
  std::string memory_snapshot() const {
    size_t size = 0;
    detail::check(arcpool_memory_snapshot(handle_, nullptr, 0, &size));
    for (;;) {
      std::string bytes(size + size / 4 + 4096, '\0');
      const arcpool_status_t status =
          arcpool_memory_snapshot(handle_, bytes.data(), bytes.size(), &size);
      if (status == ARCPOOL_STATUS_SUCCESS) {
        bytes.resize(size);
        return bytes;
      }
      if (size <= bytes.size()) detail::check(status);  // another failure than a grown snapshot
    }
  }
  /// Resets every peak to its current value.
  void reset_peaks() { detail::check(arcpool_stats_reset_peaks(handle_)); }
  /// Completes pending reclaims and trims the pool. Blocks.
  void trim(size_t keep_bytes = 0) { detail::check(arcpool_allocator_trim(handle_, keep_bytes)); }
  /// Blocks until all work on the device completed (arcpool_allocator_synchronize_device).
  void synchronize_device() { detail::check(arcpool_allocator_synchronize_device(handle_)); }

 private:
  arcpool_allocator_t* handle_ = nullptr;
};

/// The exporting end of an IPC connection (arcpool/ipc.h, design.md §14). Move-only; the
/// destructor sends nothing more, and the claims it holds go as the importer releases them.
class ipc_exporter {
 public:
  ipc_exporter() noexcept = default;
  /// Shares `a`'s owned pool over the connected AF_UNIX socket `socket_fd`, which it then
  /// owns (arcpool_ipc_exporter_create; blocks until the importer greets). On a throw the
  /// caller still owns the socket.
  ipc_exporter(const allocator& a, int socket_fd) {
    detail::check(arcpool_ipc_exporter_create(a.get(), socket_fd, &handle_));
  }
  ipc_exporter(ipc_exporter&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  ipc_exporter& operator=(ipc_exporter&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~ipc_exporter() { arcpool_ipc_exporter_destroy(handle_); }

  /// Sends `b`'s allocation; the exporter holds a claim of its own until the importer released
  /// it (arcpool_ipc_send).
  void send(const buffer_base& b) { detail::check(arcpool_ipc_send(handle_, b.get())); }
  /// Allocations sent and not yet released.
  size_t outstanding() const {
    size_t n = 0;
    detail::check(arcpool_ipc_exporter_outstanding(handle_, &n));
    return n;
  }

 private:
  arcpool_ipc_exporter_t* handle_ = nullptr;
};

/// The importing end of an IPC connection (arcpool/ipc.h, design.md §14). Move-only; the
/// connection closes once this object and every buffer received are gone.
class ipc_importer {
 public:
  ipc_importer() noexcept = default;
  /// Imports the pool an exporter shares over `socket_fd`, which it then owns, on `a`'s device
  /// (arcpool_ipc_importer_create; blocks until the pool arrives). On a throw the caller still
  /// owns the socket.
  ipc_importer(const allocator& a, int socket_fd) {
    detail::check(arcpool_ipc_importer_create(a.get(), socket_fd, &handle_));
  }
  ipc_importer(ipc_importer&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  ipc_importer& operator=(ipc_importer&& other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~ipc_importer() { arcpool_ipc_importer_destroy(handle_); }

  /// The next allocation sent, usable on `s` (arcpool_ipc_receive; blocks until it arrives).
  /// Throws arcpool::error with ARCPOOL_STATUS_PEER_GONE once the exporter is gone.
  buffer receive(stream_t s) {
    arcpool_allocation_t* h = nullptr;
    detail::check(arcpool_ipc_receive(handle_, s, &h));
    return buffer(h);
  }

 private:
  arcpool_ipc_importer_t* handle_ = nullptr;
};

}  // namespace arcpool
