#include "model/harness.hpp"

#include <cstring>
#include <sstream>
#include <vector>

#include "core/allocator.hpp"
#include "drivers/deterministic.hpp"
#include "model/reference_model.hpp"

namespace arcpool::model {
namespace {

namespace det = detail::deterministic;

/// Reads the program: one byte per choice, zeros once exhausted.
class program {
 public:
  program(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  size_t pick(size_t n) { return n == 0 ? 0 : byte() % n; }
  uint64_t seed() {
    uint64_t s = 0;
    for (int i = 0; i < 8; ++i)
      s = (s << 8) | byte();
    return s | 1;  // nonzero: the deterministic mode
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

/// A handle the harness holds references on.
struct handle {
  arcpool_allocation_t* h;
  int id;         // the model's allocation
  bool view;      // a view handle (its own references; one record reference while alive)
  uint32_t refs;  // references the harness holds on this handle
  size_t size;    // bytes of the handle's range
  size_t offset;  // offset of the range within the allocation's data
  size_t alignment;
};

struct raw_allocation {
  char* pointer;
  size_t size;
  int stream;
};

constexpr size_t kSizes[] = {0, 16, 256, 1000, 4096, 65536, size_t{1} << 20, size_t{1} << 50};
constexpr size_t kAlignments[] = {0, 256, 512, 4096, 3, size_t{1} << 22};
constexpr uint32_t kDeallocateFlags[] = {
    0,
    ARCPOOL_DEALLOCATE_FLAG_FORCE,
    ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE,
    ARCPOOL_DEALLOCATE_FLAG_PREFER_ORIGIN,
    ARCPOOL_DEALLOCATE_FLAG_DEFERRED,
    ARCPOOL_DEALLOCATE_FLAG_FORCE | ARCPOOL_DEALLOCATE_FLAG_DEFERRED,
    ARCPOOL_DEALLOCATE_FLAG_WAIT_AND_FREE | ARCPOOL_DEALLOCATE_FLAG_DEFERRED,  // invalid
    1u << 9,                                                                   // invalid
};

class harness {
 public:
  harness(const uint8_t* data, size_t size) : in_(data, size) {}

  ~harness() {
    // Whatever happened, give everything back so that the allocator is torn down.
    for (handle& h : handles_) {
      for (uint32_t i = 0; i < h.refs; ++i)
        arcpool_allocation_release(h.h);
    }
    for (raw_allocation& r : raw_)
      arcpool_free_async(r.pointer, r.size, 0, stream(r.stream));
    if (alloc_ != nullptr) {
      arcpool_default_allocator_set(0, nullptr);
      for (size_t i = 1; i < streams_.size(); ++i) {
        if (i == kAppStream || i == kRegisteredStream) continue;
        arcpool_stream_destroy(alloc_, streams_[i]);
      }
      arcpool_allocator_destroy(alloc_);
    }
  }

  std::string run() {
    setup();
    while (failure_.empty() && !in_.done())
      step();
    if (failure_.empty()) finish();
    return failure_.empty() ? std::string() : report();
  }

 private:
  static constexpr size_t kAppStream = 4;         // unregistered application stream
  static constexpr size_t kRegisteredStream = 5;  // registered / unregistered by the program

  void setup() {
    arcpool_allocator_options_t o;
    arcpool_allocator_options_init(&o);
    o.driver = ARCPOOL_DRIVER_HOST;
    o.host_deterministic_seed = in_.seed();
    o.stream_cache_bytes = in_.pick(2) ? size_t{1} << 20 : 0;  // the fast path, or not
    o.event_pool_capacity = 1 + in_.pick(4);
    expect(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_create(&o, &alloc_), "allocator_create");
    drv_ = &detail::from_handle(alloc_)->drv();
    streams_.push_back(nullptr);  // 0: the legacy default stream
    for (int i = 0; i < 3; ++i) {
      arcpool_stream_t s = nullptr;
      expect(ARCPOOL_STATUS_SUCCESS, arcpool_stream_create(alloc_, &s), "stream_create");
      streams_.push_back(s);
    }
    for (int i = 0; i < 2; ++i) {
      arcpool_stream_t s = nullptr;
      expect(ARCPOOL_STATUS_SUCCESS, drv_->stream_create(&s), "application stream");
      streams_.push_back(s);
    }
    expect(ARCPOOL_STATUS_SUCCESS, arcpool_default_allocator_set(0, alloc_), "default_set");
  }

  arcpool_stream_t stream(int i) const { return streams_[static_cast<size_t>(i)]; }
  int any_stream() { return static_cast<int>(in_.pick(streams_.size())); }

  void step() {
    switch (in_.pick(18)) {
      case 0:
      case 1:
        return allocate();
      case 2:
        return deallocate();
      case 3:
        return preserve();
      case 4:
        return discard();
      case 5:
        return retain();
      case 6:
        return release();
      case 7:
        return transfer();
      case 8:
        return record_use();
      case 9:
        return view();
      case 10:
        return export_memory();
      case 11:
        return access();
      case 12:
        return check_one();
      case 13:
        return run_scheduler();
      case 14:
        return by_pointer();
      case 15:
        return null_arguments();
      case 16:
        return toggle_registration();
      default:
        return poll();
    }
  }

  handle* any_handle() { return handles_.empty() ? nullptr : &handles_[in_.pick(handles_.size())]; }
  allocation& of(const handle& h) { return model_.at(h.id); }

  // --- Operations ----------------------------------------------------------------------
  void allocate() {
    const size_t size = kSizes[in_.pick(std::size(kSizes))];
    const size_t alignment = kAlignments[in_.pick(std::size(kAlignments))];
    const int s = any_stream();
    const uint32_t flags = std::vector<uint32_t>{0, ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME,
                                                 1u << 5}[in_.pick(3)];
    trace("allocate " + std::to_string(size) + " B align " + std::to_string(alignment) + " on s" +
          std::to_string(s) + " flags " + std::to_string(flags));
    arcpool_allocation_t* h = nullptr;
    const arcpool_status_t got =
        arcpool_allocate_async(alloc_, size, alignment, stream(s), flags, &h);
    arcpool_status_t want = ARCPOOL_STATUS_SUCCESS;
    const bool bad_alignment =
        alignment != 0 && ((alignment & (alignment - 1)) != 0 || alignment > ARCPOOL_MAX_ALIGNMENT);
    if (bad_alignment || (flags & ~uint32_t{ARCPOOL_ALLOCATION_FLAG_INDETERMINATE_LIFETIME})) {
      want = ARCPOOL_STATUS_INVALID_ARGUMENT;
    } else if (size >= (size_t{1} << 40)) {
      want = ARCPOOL_STATUS_OUT_OF_MEMORY;
    }
    if (!expect(want, got, "allocate") || got != ARCPOOL_STATUS_SUCCESS) return;
    const int id = model_.allocate(size, s, flags != 0, registration_of(s));
    handles_.push_back({h, id, false, 1, size, 0, alignment == 0 ? 256 : alignment});
    if (size > 0) declare(handles_.back(), s, "first write", true);
  }

  void deallocate() {
    handle* h = any_handle();
    if (h == nullptr) return;
    const int s = any_stream();
    const uint32_t flags = kDeallocateFlags[in_.pick(std::size(kDeallocateFlags))];
    trace("deallocate #" + std::to_string(h->id) + " on s" + std::to_string(s) + " flags " +
          std::to_string(flags));
    const uint32_t routing = flags & ~uint32_t{ARCPOOL_DEALLOCATE_FLAG_FORCE};
    const bool invalid = (flags & (1u << 9)) || (routing & (routing - 1)) != 0;
    const arcpool_status_t want =
        invalid ? ARCPOOL_STATUS_INVALID_ARGUMENT
                : model_.deallocate(h->id, flags & ARCPOOL_DEALLOCATE_FLAG_FORCE);
    expect(want, arcpool_deallocate_async(h->h, stream(s), flags), "deallocate");
  }

  void preserve() {
    handle* h = any_handle();
    if (h == nullptr) return;
    trace("preserve #" + std::to_string(h->id));
    expect(model_.preserve(h->id), arcpool_allocation_preserve(h->h), "preserve");
  }

  void discard() {
    handle* h = any_handle();
    if (h == nullptr) return;
    trace("discard #" + std::to_string(h->id));
    bool want_last = false;
    const arcpool_status_t want = model_.discard(h->id, &want_last);
    int last = -1;
    if (expect(want, arcpool_allocation_discard(h->h, &last), "discard") &&
        want == ARCPOOL_STATUS_SUCCESS && (last != 0) != want_last) {
      fail_with("discard reported last=" + std::to_string(last) + ", the model " +
                std::to_string(want_last));
    }
  }

  void retain() {
    handle* h = any_handle();
    if (h == nullptr) return;
    trace("retain #" + std::to_string(h->id) + (h->view ? " (view)" : ""));
    if (!expect(ARCPOOL_STATUS_SUCCESS, arcpool_allocation_retain(h->h), "retain")) return;
    ++h->refs;
    if (!h->view) ++of(*h).references;
  }

  void release() {
    const size_t i = handles_.empty() ? 0 : in_.pick(handles_.size());
    if (handles_.empty()) return;
    handle h = handles_[i];
    trace("release #" + std::to_string(h.id) + (h.view ? " (view)" : ""));
    expect(ARCPOOL_STATUS_SUCCESS, arcpool_allocation_release(h.h), "release");
    if (--handles_[i].refs == 0) handles_.erase(handles_.begin() + static_cast<long>(i));
    if (h.view && h.refs > 1) return;  // the view still holds its record reference
    bool implicit = false;
    model_.release(h.id, &implicit);
  }

  void transfer() {
    handle* h = any_handle();
    if (h == nullptr) return;
    const int s = any_stream();
    trace("transfer #" + std::to_string(h->id) + " to s" + std::to_string(s));
    const arcpool_status_t want = model_.transfer(h->id, s, registration_of(s));
    if (expect(want, arcpool_transfer(h->h, stream(s)), "transfer") &&
        want == ARCPOOL_STATUS_SUCCESS && of(*h).size > 0) {
      declare(*h, s, "write after transfer", true);
    }
  }

  void record_use() {
    handle* h = any_handle();
    if (h == nullptr) return;
    const int s = any_stream();
    trace("record_use #" + std::to_string(h->id) + " on s" + std::to_string(s));
    allocation& a = of(*h);
    // A real use first: the user stream waits for the current one (the application's own
    // synchronization), then touches the memory; the use is recorded after it.
    if (reference_model::usable(a) && a.size > 0 && s != a.current) {
      expect(ARCPOOL_STATUS_SUCCESS, det::wait_stream(*drv_, stream(s), stream(a.current)),
             "wait_stream");
      declare(*h, s, "read on a side stream");
    }
    expect(model_.record_use(h->id, s, registration_of(s)), arcpool_record_use(h->h, stream(s)),
           "record_use");
  }

  void view() {
    handle* h = any_handle();
    if (h == nullptr) return;
    const size_t offset = h->size == 0 ? 0 : in_.pick(h->size + 2);
    const size_t size = in_.pick(h->size + 2);
    trace("view #" + std::to_string(h->id) + " [" + std::to_string(offset) + ", +" +
          std::to_string(size) + ")");
    arcpool_status_t want = model_.touch(h->id);
    if (want == ARCPOOL_STATUS_SUCCESS && (offset > h->size || size > h->size - offset)) {
      want = ARCPOOL_STATUS_INVALID_ARGUMENT;
    }
    arcpool_allocation_t* v = nullptr;
    if (!expect(want, arcpool_allocation_view(h->h, offset, size, &v), "view") ||
        want != ARCPOOL_STATUS_SUCCESS) {
      return;
    }
    if (arcpool_allocation_size(v) != size) fail_with("view size differs");
    ++of(*h).references;
    handles_.push_back({v, h->id, true, 1, size, h->offset + offset, h->alignment});
  }

  void export_memory() {
    handle* h = any_handle();
    if (h == nullptr) return;
    trace("export #" + std::to_string(h->id));
    allocation& a = of(*h);
    const arcpool_status_t want =
        model_.export_memory(h->id, h->alignment > 256, registered_ ? registration_ : 0);
    void* p = nullptr;
    if (!expect(want, arcpool_allocation_export(h->h, &p), "export") ||
        want != ARCPOOL_STATUS_SUCCESS) {
      return;
    }
    // The memory is ours now: free it the way its new owner must, after its current stream.
    if (p != nullptr) {
      expect(ARCPOOL_STATUS_SUCCESS, drv_->pool_free(p, a.size, stream(a.current)),
             "free exported");
    }
  }

  void access() {
    handle* h = any_handle();
    if (h == nullptr) return;
    allocation& a = of(*h);
    if (!reference_model::usable(a) || a.size == 0 || h->size == 0) return;  // no legal use
    // After its stream was unregistered, work there is not covered (arcpool no longer touches
    // it): an application transfers the memory first. Not a legal use either.
    if (retired(a)) return;
    trace("read #" + std::to_string(h->id) + " on its current stream s" +
          std::to_string(a.current));
    declare(*h, a.current, "read on the current stream");
  }

  void check_one() {
    handle* h = any_handle();
    if (h == nullptr) return;
    trace("check #" + std::to_string(h->id));
    check(*h);
  }

  void run_scheduler() {
    const size_t steps = in_.pick(16);
    trace("run " + std::to_string(steps) + " steps");
    det::run(*drv_, steps);
    check_violations();
  }

  void poll() {
    trace("reclaim poll");
    detail::from_handle(alloc_)->reclaim_poll_once();
  }

  void by_pointer() {
    switch (in_.pick(3)) {
      case 0: {
        const size_t size = kSizes[1 + in_.pick(5)];
        const int s = any_stream();
        trace("malloc_async " + std::to_string(size) + " on s" + std::to_string(s));
        void* p = arcpool_malloc_async(size, 0, stream(s));
        if (p == nullptr) {
          fail_with(std::string("malloc_async failed: ") + arcpool_last_error());
          return;
        }
        raw_.push_back({static_cast<char*>(p), size, s});
        expect(ARCPOOL_STATUS_SUCCESS, det::access(*drv_, p, size, stream(s), "raw write"),
               "access");
        return;
      }
      case 1: {  // free: an interior pointer of a live one, or an unknown pointer
        const bool known = !raw_.empty() && in_.pick(4) != 0;
        const int s = any_stream();
        if (known) {
          const size_t i = in_.pick(raw_.size());
          raw_allocation r = raw_[i];
          char* interior = r.pointer + in_.pick(r.size);
          // No wait of ours: arcpool must order the free after the block's stream itself.
          trace("free_async interior pointer of a " + std::to_string(r.size) + " B block on s" +
                std::to_string(s));
          if (expect(ARCPOOL_STATUS_SUCCESS, arcpool_free_async(interior, r.size, 0, stream(s)),
                     "free_async")) {
            raw_.erase(raw_.begin() + static_cast<long>(i));
          }
        } else {
          trace("free_async of an unknown pointer");
          static char not_arcpools[64];
          expect(ARCPOOL_STATUS_UNKNOWN_POINTER,
                 arcpool_free_async(not_arcpools + in_.pick(64), 8, 0, stream(s)), "free_async");
        }
        return;
      }
      default: {
        const bool known = !raw_.empty() && in_.pick(2) != 0;
        const int s = any_stream();
        trace(std::string("record_stream of a ") + (known ? "live" : "unknown") + " pointer");
        if (known) {
          raw_allocation& r = raw_[in_.pick(raw_.size())];
          expect(ARCPOOL_STATUS_SUCCESS, arcpool_record_stream(r.pointer, stream(s)),
                 "record_stream");
        } else {
          int x = 0;
          expect(ARCPOOL_STATUS_UNKNOWN_POINTER, arcpool_record_stream(&x, stream(s)),
                 "record_stream");
        }
      }
    }
  }

  void null_arguments() {
    trace("null arguments");
    arcpool_allocation_t* out = nullptr;
    void* p = nullptr;
    expect(ARCPOOL_STATUS_INVALID_ARGUMENT,
           arcpool_allocate_async(nullptr, 16, 0, nullptr, 0, &out), "allocate(NULL allocator)");
    expect(ARCPOOL_STATUS_INVALID_ARGUMENT,
           arcpool_allocate_async(alloc_, 16, 0, nullptr, 0, nullptr), "allocate(NULL out)");
    expect(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_deallocate_async(nullptr, nullptr, 0),
           "deallocate(NULL)");
    expect(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_preserve(nullptr), "preserve(NULL)");
    expect(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_transfer(nullptr, nullptr), "transfer(NULL)");
    expect(ARCPOOL_STATUS_INVALID_ARGUMENT, arcpool_allocation_data(nullptr, &p), "data(NULL)");
  }

  void toggle_registration() {
    const bool registering = !registered_;
    trace(registering ? "register s5" : "unregister s5");
    const arcpool_status_t got = registering
                                     ? arcpool_stream_register(alloc_, stream(kRegisteredStream))
                                     : arcpool_stream_unregister(alloc_, stream(kRegisteredStream));
    if (expect(ARCPOOL_STATUS_SUCCESS, got, registering ? "register" : "unregister")) {
      registered_ = registering;
      if (registering) ++registration_;
    }
  }

  // --- Checks --------------------------------------------------------------------------
  /// Declares a use of `h` on stream `s`: a write (after allocation or transfer, when the
  /// stream owns the memory) or a read (any other use, which may overlap other reads).
  void declare(const handle& h, int s, const char* what, bool write = false) {
    void* p = nullptr;
    if (arcpool_allocation_data(h.h, &p) != ARCPOOL_STATUS_SUCCESS || p == nullptr || h.size == 0) {
      return;
    }
    expect(ARCPOOL_STATUS_SUCCESS,
           det::access(*drv_, p, h.size, stream(s),
                       std::string(what) + " of #" + std::to_string(h.id) + " (op " +
                           std::to_string(trace_.size()) + ")",
                       write),
           "declare access");
  }

  void check(const handle& h) {
    const allocation& a = of(h);
    arcpool_allocation_info_t info{};
    info.struct_size = sizeof(info);
    info.version = ARCPOOL_ALLOCATION_INFO_VERSION;
    if (!expect(ARCPOOL_STATUS_SUCCESS, arcpool_allocation_info(h.h, &info), "info")) return;
    if (info.state != a.state || info.owners != a.owners || info.references != a.references) {
      fail_with("info of #" + std::to_string(h.id) + ": state " + std::to_string(info.state) +
                " owners " + std::to_string(info.owners) + " references " +
                std::to_string(info.references) + "; the model: state " + std::to_string(a.state) +
                " owners " + std::to_string(a.owners) + " references " +
                std::to_string(a.references));
      return;
    }
    if (reference_model::usable(a)) {
      if (info.current_stream != stream(a.current) || info.use_records != a.uses.size()) {
        fail_with("streams of #" + std::to_string(h.id) + ": current " +
                  std::to_string(reinterpret_cast<uintptr_t>(info.current_stream)) + " uses " +
                  std::to_string(info.use_records) + "; the model: s" + std::to_string(a.current) +
                  ", " + std::to_string(a.uses.size()) + " uses");
      }
    }
    void* p = nullptr;
    expect(model_.touch(h.id), arcpool_allocation_data(h.h, &p), "data");
    const int terminal = a.state == ARCPOOL_ALLOCATION_LIVE && a.owners == 1;
    if (arcpool_allocation_is_terminal(h.h) != terminal) fail_with("is_terminal differs");
  }

  void check_violations() {
    const auto v = det::violations(*drv_);
    if (!v.empty()) fail_with("happens-before violation: " + v.front());
  }

  void finish() {
    trace("finish: check every handle, release everything, drain");
    for (const handle& h : handles_)
      check(h);
    if (!failure_.empty()) return;
    for (handle& h : handles_) {
      for (uint32_t i = 0; i < h.refs; ++i)
        arcpool_allocation_release(h.h);
    }
    handles_.clear();
    for (raw_allocation& r : raw_) {
      expect(ARCPOOL_STATUS_SUCCESS, arcpool_free_async(r.pointer, r.size, 0, stream(r.stream)),
             "free_async");
    }
    raw_.clear();
    for (size_t i = 0; i < streams_.size(); ++i) {
      expect(ARCPOOL_STATUS_SUCCESS, arcpool_stream_synchronize(alloc_, streams_[i]), "sync");
    }
    expect(ARCPOOL_STATUS_SUCCESS, arcpool_allocator_trim(alloc_, 0), "trim");
    det::run(*drv_);
    check_violations();
    arcpool_stats_t st{};
    st.struct_size = sizeof(st);
    st.version = ARCPOOL_STATS_VERSION;
    arcpool_stats_get(alloc_, &st);
    if (st.bytes_in_use_current != 0 || st.allocations_in_use_current != 0 ||
        st.bytes_held_current != 0 || st.bytes_pending_free_current != 0) {
      fail_with("after everything was released: " + std::to_string(st.bytes_in_use_current) +
                " B in use, " + std::to_string(st.allocations_in_use_current) + " allocations, " +
                std::to_string(st.bytes_held_current) + " B held, " +
                std::to_string(st.bytes_pending_free_current) + " B pending");
    }
  }

  bool expect(arcpool_status_t want, arcpool_status_t got, const char* what) {
    if (want == got) return true;
    fail_with(std::string(what) + ": expected " + arcpool_status_string(want) + ", got " +
              arcpool_status_string(got) +
              (got == ARCPOOL_STATUS_SUCCESS ? std::string()
                                             : std::string(" (") + arcpool_last_error() + ")"));
    return false;
  }

  void fail_with(const std::string& why) {
    if (failure_.empty()) failure_ = why;
  }
  void trace(std::string op) { trace_.push_back(std::move(op)); }

  std::string report() const {
    std::ostringstream out;
    out << "operation " << trace_.size() << " (" << (trace_.empty() ? "setup" : trace_.back())
        << "): " << failure_ << "\nthe operations that led to it:\n";
    const size_t first = trace_.size() > 40 ? trace_.size() - 40 : 0;
    for (size_t i = first; i < trace_.size(); ++i)
      out << "  " << i + 1 << ". " << trace_[i] << "\n";
    return out.str();
  }

  program in_;
  reference_model model_;
  arcpool_allocator_t* alloc_ = nullptr;
  detail::driver* drv_ = nullptr;
  std::vector<arcpool_stream_t> streams_;
  std::vector<handle> handles_;
  std::vector<raw_allocation> raw_;
  bool registered_ = false;
  int registration_ = 0;  // counts registrations of s5; the live one while registered_

  /// The registration a stream has now (0: none): only s5 is ever registered by the program;
  /// streams arcpool created are never retired during a run.
  bool retired(const allocation& a) const {
    return a.current_registration != 0 && (!registered_ || a.current_registration != registration_);
  }

  int registration_of(int s) const {
    return s == static_cast<int>(kRegisteredStream) && registered_ ? registration_ : 0;
  }
  std::vector<std::string> trace_;
  std::string failure_;
};

}  // namespace

std::string run_harness(const uint8_t* data, size_t size) {
  return harness(data, size).run();
}

}  // namespace arcpool::model
