// The deterministic host driver and its happens-before checker (see deterministic.hpp).
// Single-threaded by construction: every task runs on the thread that drives the scheduler.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <unordered_map>

#include "drivers/deterministic.hpp"
#include "drivers/deterministic_state.hpp"
#include "support/status.hpp"

namespace arcpool::detail {
namespace {

using deterministic::state::access_record;
using deterministic::state::block_state;
using deterministic::state::det_event;
using deterministic::state::det_stream;
using deterministic::state::join;
using deterministic::state::leq;
using deterministic::state::marker;
using deterministic::state::task;
using deterministic::state::vclock;

std::atomic<uint64_t> g_next_id{uint64_t{1} << 50};

class deterministic_driver final : public driver {
 public:
  explicit deterministic_driver(const driver_config& config)
      : device_(config.device),
        capacity_(config.host_capacity_bytes),
        rng_(config.host_deterministic_seed) {
    legacy_ = new_stream();
    per_thread_ = new_stream();
  }

  ~deterministic_driver() override {
    for (auto& [base, b] : blocks_)
      std::free(reinterpret_cast<void*>(base));
    for (void* p : quarantine_)
      std::free(p);
  }

  arcpool_driver_kind_t kind() const noexcept override { return ARCPOOL_DRIVER_HOST; }
  int device() const noexcept override { return device_; }
  bool allows_worker_threads() const noexcept override { return false; }

  // --- Streams -----------------------------------------------------------------------------
  arcpool_status_t stream_create(stream_handle* out) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_work("stream_create"));
    *out = handle_of(new_stream());
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_destroy(stream_handle s) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_destroy", &st));
    if (st == legacy_ || st == per_thread_) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT, "cannot destroy a default stream");
    }
    run_until([&] { return st->queue.empty(); }, "stream_destroy");  // queued work still runs
    streams_.erase(st);
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_synchronize(stream_handle s) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_synchronize", &st));
    ARCPOOL_RETURN_IF_ERROR(run_until([&] { return st->queue.empty(); }, "stream_synchronize"));
    join(host_clock_, st->clock);  // the host saw everything queued on it complete
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_id(stream_handle s, uint64_t* out) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_id", &st));
    *out = st->id;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_is_capturing(stream_handle s, bool* out) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_is_capturing", &st));
    *out = st->capturing;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_begin_capture(stream_handle s) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_begin_capture", &st));
    st->capturing = true;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_end_capture(stream_handle s) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve(s, "stream_end_capture", &st));
    st->capturing = false;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t launch_host_func(stream_handle s, arcpool_host_fn_t fn,
                                    void* user_data) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "launch_host_func", &st));
    push(*st, {{}, [this, fn, user_data](det_stream&) {
                 in_work_ = true;
                 fn(user_data);
                 in_work_ = false;
               }});
    return ARCPOOL_STATUS_SUCCESS;
  }

  // --- Events ------------------------------------------------------------------------------
  arcpool_status_t event_create(event_handle* out) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_work("event_create"));
    *out = new det_event();
    ++live_events_;
    return ARCPOOL_STATUS_SUCCESS;
  }
  void event_destroy(event_handle e) noexcept override {
    delete static_cast<det_event*>(e);
    --live_events_;
  }
  arcpool_status_t event_record(event_handle e, stream_handle s) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "event_record", &st));
    auto m = std::make_shared<marker>();
    static_cast<det_event*>(e)->last = m;
    push(*st, {{}, [m](det_stream& on) {
                 m->clock = on.clock;
                 m->done = true;
               }});
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t stream_wait_event(stream_handle s, event_handle e) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "stream_wait_event", &st));
    std::shared_ptr<marker> m = static_cast<det_event*>(e)->last;  // the state at the call
    if (m) {
      push(*st, {[m] { return m->done; }, [m](det_stream& on) { join(on.clock, m->clock); }});
    }
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t event_query(event_handle e, bool* done) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_work("event_query"));
    const auto& m = static_cast<det_event*>(e)->last;
    *done = !m || m->done;
    if (m && m->done) join(host_clock_, m->clock);  // the host saw it complete
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t event_synchronize(event_handle e) override {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_work("event_synchronize"));
    std::shared_ptr<marker> m = static_cast<det_event*>(e)->last;
    ARCPOOL_RETURN_IF_ERROR(run_until([&] { return !m || m->done; }, "event_synchronize"));
    if (m) join(host_clock_, m->clock);
    return ARCPOOL_STATUS_SUCCESS;
  }

  // --- Pool --------------------------------------------------------------------------------
  arcpool_status_t pool_allocate(size_t bytes, stream_handle s, void** out) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "pool_allocate", &st));
    const size_t rounded = (std::max<size_t>(bytes, 1) + 255) & ~size_t{255};
    if (reserved_ + rounded > capacity_) {
      // Memory freed earlier on this stream is reusable in its order, as in a CUDA pool.
      ARCPOOL_RETURN_IF_ERROR(run_until([&] { return st->queue.empty(); }, "pool_allocate"));
      if (reserved_ + rounded > capacity_) {
        return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "deterministic host pool: %zu bytes over %zu",
                    bytes, capacity_);
      }
    }
    void* p = std::aligned_alloc(256, rounded);
    if (p == nullptr) return fail(ARCPOOL_STATUS_OUT_OF_MEMORY, "aligned_alloc(%zu)", rounded);
    reserved_ += rounded;
    peak_ = std::max(peak_, reserved_);
    block_state& b = blocks_[reinterpret_cast<uintptr_t>(p)];
    b.bytes = rounded;
    enqueue_acquire(*st, p, "allocation");
    *out = p;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t pool_free(void* p, size_t, stream_handle s) override {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "pool_free", &st));
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    push(*st, {{}, [this, base](det_stream& on) {
                 release(on, base, "pool free");
                 auto it = blocks_.find(base);
                 if (it == blocks_.end()) return;
                 reserved_ -= it->second.bytes;
                 // Quarantined, never reused: a late access stays a clear report.
                 quarantine_.push_back(reinterpret_cast<void*>(base));
                 retired_blocks_[base] = std::move(it->second);
                 blocks_.erase(it);
               }});
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t pool_trim(size_t) override { return check_not_in_work("pool_trim"); }
  void pool_reset_peak() noexcept override { peak_ = reserved_; }
  pool_figures pool_query() override {
    pool_figures f;
    f.reserved_current = f.used_current = reserved_;
    f.reserved_peak = peak_;
    return f;
  }
  arcpool_status_t device_memory(size_t* out) override {
    *out = capacity_;
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t device_synchronize() override {
    ARCPOOL_RETURN_IF_ERROR(run_until([&] { return all_empty(); }, "device_synchronize"));
    for (const auto& [raw, st] : streams_)
      join(host_clock_, st->clock);
    return ARCPOOL_STATUS_SUCCESS;
  }
  void enter_reclaim_thread() noexcept override {}

  // --- Checking ----------------------------------------------------------------------------
  bool notes_cache_moves() const noexcept override { return true; }
  void note_release(void* p, size_t, stream_handle s) noexcept override {
    det_stream* st = find(s);
    if (st == nullptr) return;
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    push(*st, {{}, [this, base](det_stream& on) { release(on, base, "cache release"); }});
  }
  void note_acquire(void* p, size_t, stream_handle s) noexcept override {
    if (det_stream* st = find(s)) enqueue_acquire(*st, p, "cache hit");
  }

  arcpool_status_t declare_access(const void* p, size_t bytes, stream_handle s,
                                  const std::string& label, bool write) {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "access", &st));
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    push(*st, {{}, [this, address, bytes, label, write](det_stream& on) {
                 check_access(on, address, bytes, label, write);
               }});
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t wait_stream(stream_handle waiter, stream_handle target) {
    det_stream* w = nullptr;
    det_stream* t = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(waiter, "wait_stream", &w));
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(target, "wait_stream", &t));
    auto m = std::make_shared<marker>();
    push(*t, {{}, [m](det_stream& on) {
                m->clock = on.clock;
                m->done = true;
              }});
    push(*w, {[m] { return m->done; }, [m](det_stream& on) { join(on.clock, m->clock); }});
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t hold(stream_handle s, std::shared_ptr<const std::atomic<bool>> open) {
    det_stream* st = nullptr;
    ARCPOOL_RETURN_IF_ERROR(resolve_for_work(s, "hold", &st));
    push(*st, {[open] { return open->load(); }, [](det_stream&) {}});
    return ARCPOOL_STATUS_SUCCESS;
  }

  size_t run_steps(size_t steps) {
    size_t n = 0;
    while ((steps == 0 || n < steps) && step())
      ++n;
    return n;
  }

  std::vector<std::string> violations() const { return violations_; }

  size_t live_events() const { return live_events_; }

  uint64_t enqueued_on(stream_handle s) const {
    const det_stream* st = find(s);
    return st == nullptr ? 0 : st->enqueued;
  }

 private:
  det_stream* new_stream() {
    auto s = std::make_unique<det_stream>();
    s->id = g_next_id.fetch_add(1);
    s->slot = next_slot_++;
    det_stream* raw = s.get();
    streams_.emplace(raw, std::move(s));
    return raw;
  }
  static stream_handle handle_of(det_stream* s) { return reinterpret_cast<stream_handle>(s); }

  det_stream* find(stream_handle s) const {
    if (s == legacy_default_stream() || s == legacy_stream_alias()) return legacy_;
    if (s == per_thread_default_stream()) return per_thread_;
    auto it = streams_.find(reinterpret_cast<det_stream*>(s));
    return it == streams_.end() ? nullptr : it->first;
  }

  arcpool_status_t check_not_in_work(const char* what) const {
    if (in_work_) {
      return fail(ARCPOOL_STATUS_NOT_PERMITTED,
                  "deterministic host driver: %s called from inside stream-ordered host work",
                  what);
    }
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t resolve(stream_handle s, const char* what, det_stream** out) const {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_work(what));
    *out = find(s);
    if (*out == nullptr) {
      return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                  "deterministic host driver: %s: %p is not a "
                  "stream of this driver",
                  what, static_cast<void*>(s));
    }
    return ARCPOOL_STATUS_SUCCESS;
  }
  arcpool_status_t resolve_for_work(stream_handle s, const char* what, det_stream** out) const {
    ARCPOOL_RETURN_IF_ERROR(resolve(s, what, out));
    if ((*out)->capturing) {
      return fail(ARCPOOL_STATUS_UNSUPPORTED,
                  "deterministic host driver: %s on a capturing "
                  "stream",
                  what);
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  /// Queues `t` on `st`, stamped with the host's clock.
  void push(det_stream& st, task t) {
    t.host = host_clock_;
    st.queue.push_back(std::move(t));
    ++st.enqueued;
  }

  bool all_empty() const {
    for (const auto& [raw, s] : streams_) {
      if (!s->queue.empty()) return false;
    }
    return true;
  }

  /// Runs one task on a stream the RNG picks among those whose next task can run. False when
  /// none can.
  bool step() {
    std::vector<det_stream*> runnable;
    for (const auto& [raw, s] : streams_) {
      if (!s->queue.empty() && (!s->queue.front().ready || s->queue.front().ready())) {
        runnable.push_back(raw);
      }
    }
    if (runnable.empty()) return false;
    // Iterating an unordered_map of pointers is not deterministic: order by stream id first.
    std::sort(runnable.begin(), runnable.end(),
              [](const det_stream* a, const det_stream* b) { return a->id < b->id; });
    det_stream* s = runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng_)];
    task t = std::move(s->queue.front());
    s->queue.pop_front();
    if (s->clock.size() <= s->slot) s->clock.resize(s->slot + 1, 0);
    ++s->clock[s->slot];
    join(s->clock, t.host);
    t.run(*s);
    return true;
  }

  template <class F>
  arcpool_status_t run_until(F&& done, const char* what) {
    ARCPOOL_RETURN_IF_ERROR(check_not_in_work(what));
    while (!done()) {
      if (!step()) {
        violations_.push_back(std::string("deadlock: ") + what +
                              " waits for work that can never run");
        return fail(ARCPOOL_STATUS_CUDA_ERROR, "deterministic host driver: %s would wait forever",
                    what);
      }
    }
    return ARCPOOL_STATUS_SUCCESS;
  }

  void enqueue_acquire(det_stream& st, void* p, const char* how) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(p);
    std::string label = std::string(how) + " on " + st.name();
    push(st, {{}, [this, base, label](det_stream& on) {
                auto it = blocks_.find(base);
                if (it == blocks_.end()) return;
                block_state& b = it->second;
                if (b.acquired && !b.released) {
                  violations_.push_back(label + ": block " + hex(base) +
                                        " handed out while still in use");
                }
                // A re-handed block follows its release (same stream for a cache).
                vclock c = on.clock;
                if (b.released) join(c, b.release_clock);
                b.acquire_clock = c;
                b.acquired = true;
                b.released = false;
                b.accesses.clear();
                ++b.epoch;
              }});
  }

  void release(det_stream& on, uintptr_t base, const char* how) {
    const std::string here = std::string(how) + " on " + on.name();
    auto it = blocks_.find(base);
    if (it == blocks_.end()) {
      // cudaFreeAsync of a pointer no pool handed out, or handed out and freed: an error, and a
      // double free into a real pool lets two later allocations overlap (this driver never
      // reuses a block, so the overlap itself could not show).
      const std::string retired = retired_containing(base);
      violations_.push_back(here + " of " + hex(base) + ": " +
                            (retired.empty() ? "no block arcpool holds starts there"
                                             : "the block was freed already (" + retired + ")"));
      return;
    }
    block_state& b = it->second;
    for (const access_record& a : b.accesses) {
      if (!leq(a.clock, on.clock)) {
        violations_.push_back(here + " of block " + hex(base) + " is not ordered after " + a.label +
                              " (a missing fence)");
      }
    }
    b.released = true;
    b.release_clock = on.clock;
    b.release_label = here;
  }

  void check_access(det_stream& on, uintptr_t address, size_t bytes, const std::string& label,
                    bool write) {
    const std::string here = label + " on " + on.name();
    auto [base, b] = containing(address);
    if (b == nullptr) {
      auto retired = retired_containing(address);
      violations_.push_back(
          here + ": " + hex(address) +
          (retired.empty() ? " is not arcpool memory" : " was freed (" + retired + ")"));
      return;
    }
    if (address + bytes > base + b->bytes) {
      violations_.push_back(here + ": [" + hex(address) + ", +" + std::to_string(bytes) +
                            ") runs past its block");
    }
    if (b->released) {
      violations_.push_back(here + ": use after " + b->release_label);
      return;
    }
    if (!b->acquired) {
      violations_.push_back(here + " ran before the allocation of block " + hex(base) +
                            " (no fence orders them)");
      return;
    }
    if (!leq(b->acquire_clock, on.clock)) {
      violations_.push_back(here + " is not ordered after the allocation of block " + hex(base));
    }
    for (const access_record& a : b->accesses) {
      if ((write || a.write) && !leq(a.clock, on.clock)) {
        violations_.push_back(here + " races with " + a.label + " on block " + hex(base) +
                              " (no fence orders them)");
      }
    }
    b->accesses.push_back({on.clock, here, write});
  }

  std::pair<uintptr_t, block_state*> containing(uintptr_t address) {
    auto it = blocks_.upper_bound(address);
    if (it == blocks_.begin()) return {0, nullptr};
    --it;
    if (address >= it->first + it->second.bytes) return {0, nullptr};
    return {it->first, &it->second};
  }
  std::string retired_containing(uintptr_t address) const {
    auto it = retired_blocks_.upper_bound(address);
    if (it == retired_blocks_.begin()) return {};
    --it;
    if (address >= it->first + it->second.bytes) return {};
    return it->second.release_label;
  }

  static std::string hex(uintptr_t v) {
    char text[24];
    std::snprintf(text, sizeof(text), "%#lx", static_cast<unsigned long>(v));
    return text;
  }

  const int device_;
  const size_t capacity_;
  std::mt19937_64 rng_;
  std::unordered_map<det_stream*, std::unique_ptr<det_stream>> streams_;
  size_t next_slot_ = 0;
  det_stream* legacy_ = nullptr;
  det_stream* per_thread_ = nullptr;
  std::map<uintptr_t, block_state> blocks_;
  std::map<uintptr_t, block_state> retired_blocks_;
  std::vector<void*> quarantine_;
  size_t reserved_ = 0;
  size_t peak_ = 0;
  bool in_work_ = false;
  size_t live_events_ = 0;
  vclock host_clock_;  // what the (single) host thread has observed complete
  std::vector<std::string> violations_;
};

deterministic_driver* as_deterministic(driver& d) {
  return dynamic_cast<deterministic_driver*>(&d);
}

}  // namespace

std::unique_ptr<driver> make_deterministic_driver(const driver_config& config) {
  return std::make_unique<deterministic_driver>(config);
}

namespace deterministic {

bool is_deterministic(const driver& d) noexcept {
  return dynamic_cast<const deterministic_driver*>(&d) != nullptr;
}

size_t run(driver& d, size_t steps) {
  deterministic_driver* dd = as_deterministic(d);
  return dd == nullptr ? 0 : dd->run_steps(steps);
}

arcpool_status_t access(driver& d, const void* p, size_t bytes, stream_handle s,
                        const std::string& label, bool write) {
  deterministic_driver* dd = as_deterministic(d);
  if (dd == nullptr) return fail(ARCPOOL_STATUS_UNSUPPORTED, "access: not a deterministic driver");
  return dd->declare_access(p, bytes, s, label, write);
}

arcpool_status_t wait_stream(driver& d, stream_handle waiter, stream_handle target) {
  deterministic_driver* dd = as_deterministic(d);
  if (dd == nullptr) return fail(ARCPOOL_STATUS_UNSUPPORTED, "wait_stream: not deterministic");
  return dd->wait_stream(waiter, target);
}

arcpool_status_t hold(driver& d, stream_handle s, std::shared_ptr<const std::atomic<bool>> open) {
  deterministic_driver* dd = as_deterministic(d);
  if (dd == nullptr) return fail(ARCPOOL_STATUS_UNSUPPORTED, "hold: not a deterministic driver");
  return dd->hold(s, std::move(open));
}

size_t live_events(const driver& d) {
  const auto* dd = dynamic_cast<const deterministic_driver*>(&d);
  return dd == nullptr ? 0 : dd->live_events();
}

uint64_t enqueued(const driver& d, stream_handle s) {
  const auto* dd = dynamic_cast<const deterministic_driver*>(&d);
  return dd == nullptr ? 0 : dd->enqueued_on(s);
}

std::vector<std::string> violations(const driver& d) {
  const auto* dd = dynamic_cast<const deterministic_driver*>(&d);
  return dd == nullptr ? std::vector<std::string>{} : dd->violations();
}

}  // namespace deterministic
}  // namespace arcpool::detail
