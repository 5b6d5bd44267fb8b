// The runtime's global state: configuration, devices, handles, clocks, violations, counters.
#include "state.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "simcuda.h"

namespace simcuda {
namespace {

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long parsed = std::strtol(v, &end, 0);
  if (end == nullptr || *end != '\0') {
    std::fprintf(stderr, "simcuda: %s=%s is not a number; using %ld\n", name, v, fallback);
    return fallback;
  }
  return parsed;
}

config read_config() {
  config c;
  c.devices = static_cast<int>(std::clamp(env_long("SIMCUDA_DEVICES", 2), 1L, 16L));
  c.capacity = static_cast<size_t>(env_long("SIMCUDA_DEVICE_MEMORY_MIB", 4096)) << 20;
  c.seed = static_cast<uint64_t>(env_long("SIMCUDA_SEED", 1));
  c.slow = env_long("SIMCUDA_SLOW", 0) != 0;
  c.sticky_after_launches = env_long("SIMCUDA_STICKY_AFTER_LAUNCHES", -1);
  c.oom_after_allocations = env_long("SIMCUDA_OOM_AFTER_ALLOCATIONS", -1);
  c.import_free_delay_us = std::max(0L, env_long("SIMCUDA_IMPORT_FREE_DELAY_US", 0));
  return c;
}

/// At exit, violations no test took fail the process: a ctest test is one process, so the
/// test that caused them fails.
void fail_on_untaken_violations() {
  runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.violations.empty()) return;
  std::fprintf(stderr, "simcuda: %zu violation(s) at exit:\n", r.violations.size());
  for (const std::string& v : r.violations)
    std::fprintf(stderr, "  %s\n", v.c_str());
  std::fflush(stderr);
  _exit(3);
}

runtime* create_runtime() {
  auto* r = new runtime;
  r->cfg = read_config();
  for (int i = 0; i < r->cfg.devices; ++i) {
    auto d = std::make_unique<device_obj>();
    d->ordinal = i;
    d->capacity = r->cfg.capacity;
    r->devices.push_back(std::move(d));
  }
  std::atexit(fail_on_untaken_violations);
  return r;
}

}  // namespace

uint64_t vclock::get(uint64_t stream) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), std::make_pair(stream, uint64_t{0}));
  return it != entries_.end() && it->first == stream ? it->second : 0;
}

void vclock::raise(uint64_t stream, uint64_t seq) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), std::make_pair(stream, uint64_t{0}));
  if (it != entries_.end() && it->first == stream) {
    it->second = std::max(it->second, seq);
  } else {
    entries_.insert(it, {stream, seq});
  }
}

void vclock::join(const vclock& other) {
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  merged.reserve(entries_.size() + other.entries_.size());
  auto a = entries_.begin();
  auto b = other.entries_.begin();
  while (a != entries_.end() || b != other.entries_.end()) {
    if (b == other.entries_.end() || (a != entries_.end() && a->first < b->first)) {
      merged.push_back(*a++);
    } else if (a == entries_.end() || b->first < a->first) {
      merged.push_back(*b++);
    } else {
      merged.emplace_back(a->first, std::max(a->second, b->second));
      ++a;
      ++b;
    }
  }
  entries_.swap(merged);
}

std::string stream_obj::name() const {
  switch (type) {
    case kind::legacy:
      return format("the legacy stream of device %d (id %llu)", device,
                    static_cast<unsigned long long>(id));
    case kind::per_thread:
      return format("a per-thread default stream of device %d (id %llu)", device,
                    static_cast<unsigned long long>(id));
    case kind::graph_lane:
      return format("a graph launch lane of device %d (id %llu)", device,
                    static_cast<unsigned long long>(id));
    case kind::created:
      break;
  }
  return format("stream 0x%llx (id %llu)", static_cast<unsigned long long>(handle),
                static_cast<unsigned long long>(id));
}

runtime& rt() {
  static runtime* r = create_runtime();
  return *r;
}

thread_state& ts() {
  static thread_local thread_state state;
  return state;
}

std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

void violation(const std::string& message) {
  runtime& r = rt();
  std::fprintf(stderr, "simcuda violation: %s\n", message.c_str());
  r.violations.push_back(message);
  ++r.violation_total;
}

void unverified(const std::string& message) {
  std::fprintf(stderr, "simcuda warning (unverified rule): %s\n", message.c_str());
  ++rt().unverified;
}

cudaError_t enter(const char* name) {
  runtime& r = rt();
  ++r.calls[name];
  if (auto it = r.fail_next.find(name); it != r.fail_next.end()) {
    const cudaError_t e = it->second;
    r.fail_next.erase(it);
    return e;
  }
  // Programming guide, "Host Functions (Callbacks)": "The commands that are issued in a stream
  // after a host function do not start executing before the function has completed. [...] A
  // host function enqueued into a stream must not make CUDA API calls (directly or
  // indirectly), as it might end up waiting on itself if it makes such a call leading to a
  // deadlock." Also the cudaLaunchHostFunc reference: "The host function must not make any
  // CUDA API calls."
  if (ts().in_host_function) violation(format("%s called from inside a host function", name));
  if (r.unloaded) return cudaErrorCudartUnloading;  // simcuda_unload_driver
  return r.sticky;
}

void pause_point(std::unique_lock<std::mutex>& lock, const char* name) {
  const auto it = rt().delays.find(name);
  if (it == rt().delays.end()) return;
  const std::chrono::milliseconds delay(it->second);
  lock.unlock();
  std::this_thread::sleep_for(delay);
  lock.lock();
}

cudaError_t ret(cudaError_t e) {
  thread_state& t = ts();
  // cudaGetLastError: "Returns the last error that has been produced by any of the runtime
  // calls in the same instance of the CUDA Runtime library in the host thread and resets it to
  // cudaSuccess." A sticky error stays: "the CUDA context is corrupted" (cudaErrorIllegalAddress).
  if (e != cudaSuccess) t.last_error = e;
  return e;
}

uintptr_t new_handle() {
  // Handles look like pointers, are never reused, and never collide with host memory.
  return uintptr_t{0x5e0000000000} + (rt().next_handle++ << 6);
}

device_obj* device_at(int d) {
  runtime& r = rt();
  return d >= 0 && d < static_cast<int>(r.devices.size()) ? r.devices[d].get() : nullptr;
}

device_obj& context_device() {
  // Runtime API, "Interactions with the CUDA Driver API": "CUDA Runtime API calls operate on
  // the CUDA Driver API CUcontext which is current to the calling host thread. [...] If no
  // CUcontext is current to the calling thread when a CUDA Runtime API call which requires an
  // active context is made, then the primary context for a device will be selected, made
  // current to the calling thread, and initialized." Which device is not said: simcuda selects
  // the runtime's own per-thread device (thread_state::selected: 0, or the thread's last
  // cudaSetDevice), which the driver's context calls do not change. Unverified, and the strict
  // choice for a library that switches devices: NVIDIA's DALI treats "the runtime selection" as
  // state of its own beside the current context (NVIDIA/DALI PR 6325), and switches devices with
  // cuCtxSetCurrent on retained primary contexts, never cudaSetDevice (PR 6327).
  thread_state& t = ts();
  device_obj& d = *rt().devices[t.device];
  ensure_context(d);
  if (!t.context_current) t.created_context = 0;
  t.context_current = true;
  return d;
}

uintptr_t context_id() {
  device_obj& d = context_device();
  const uintptr_t created = ts().created_context;
  return created != 0 ? created : reinterpret_cast<uintptr_t>(&d);
}

void ensure_context(device_obj& d) {
  if (d.context) return;
  d.context = true;
  ++d.contexts;
  if (d.legacy != nullptr) return;
  init_device_memory(d);
  d.legacy = make_stream(d, stream_obj::kind::legacy, /*blocking=*/true);
}

}  // namespace simcuda

using simcuda::rt;

extern "C" {

uint64_t simcuda_violation_count(void) {
  std::lock_guard<std::mutex> lock(rt().mu);
  return rt().violation_total;
}

uint64_t simcuda_take_violations(char* buf, size_t size) {
  simcuda::runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string all;
  for (const std::string& v : r.violations)
    all += v + "\n";
  if (size > 0) {
    const size_t n = std::min(all.size(), size - 1);
    std::memcpy(buf, all.data(), n);
    buf[n] = '\0';
  }
  const uint64_t taken = r.violations.size();
  r.violations.clear();
  return taken;
}

uint64_t simcuda_call_count(const char* name) {
  simcuda::runtime& r = rt();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.calls.find(name);
  return it == r.calls.end() ? 0 : it->second;
}

void simcuda_reset_call_counts(void) {
  std::lock_guard<std::mutex> lock(rt().mu);
  rt().calls.clear();
}

uint64_t simcuda_primary_contexts(int device) {
  std::lock_guard<std::mutex> lock(rt().mu);
  simcuda::device_obj* d = simcuda::device_at(device);
  return d == nullptr ? 0 : d->contexts;
}

uint64_t simcuda_primary_retains(int device) {
  std::lock_guard<std::mutex> lock(rt().mu);
  simcuda::device_obj* d = simcuda::device_at(device);
  return d == nullptr ? 0 : d->primary_retains;
}

void simcuda_unload_driver(void) {
  std::lock_guard<std::mutex> lock(rt().mu);
  rt().unloaded = true;
}

int simcuda_fail_next(const char* name, int error) {
  if (name == nullptr || error == cudaSuccess) return 0;
  std::lock_guard<std::mutex> lock(rt().mu);
  rt().fail_next[name] = static_cast<cudaError_t>(error);
  return 1;
}

int simcuda_delay_calls(const char* name, unsigned milliseconds) {
  if (name == nullptr) return 0;
  const auto& calls = simcuda::kPausingCalls;
  if (std::none_of(std::begin(calls), std::end(calls),
                   [&](const char* c) { return std::strcmp(c, name) == 0; })) {
    return 0;
  }
  std::lock_guard<std::mutex> lock(rt().mu);
  if (milliseconds == 0) {
    rt().delays.erase(name);
  } else {
    rt().delays[name] = milliseconds;
  }
  return 1;
}

uint64_t simcuda_destructors_run(uint64_t* longest_us) {
  std::lock_guard<std::mutex> lock(rt().mu);
  if (longest_us != nullptr) *longest_us = rt().longest_destructor_us;
  return rt().destructors_run;
}

uint64_t simcuda_hidden_waits(void) {
  std::lock_guard<std::mutex> lock(rt().mu);
  return rt().hidden_waits;
}

int simcuda_stream_settle(cudaStream_t stream) {
  std::unique_lock<std::mutex> lock(rt().mu);
  simcuda::stream_obj* s = simcuda::resolve_stream(stream, false, "simcuda_stream_settle");
  if (s == nullptr) return -1;
  std::vector<simcuda::stream_obj*> path;
  simcuda::settle(lock, *s, path);
  return 0;
}

uint64_t simcuda_unverified_warnings(void) {
  std::lock_guard<std::mutex> lock(rt().mu);
  return rt().unverified;
}

}  // extern "C"
