#include "support/simcuda_probe.hpp"

#include <dlfcn.h>

#include <vector>

namespace arcpool::test {
namespace {

template <typename Fn>
Fn lookup(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

bool on_simcuda() {
  return lookup<void*>("simcuda_violation_count") != nullptr;
}

std::string take_simcuda_violations() {
  using take_fn = uint64_t (*)(char*, size_t);
  static const take_fn take = lookup<take_fn>("simcuda_take_violations");
  if (take == nullptr) return {};
  std::vector<char> buf(1 << 16);
  return take(buf.data(), buf.size()) == 0 ? std::string() : std::string(buf.data());
}

uint64_t simcuda_calls(const char* name) {
  using count_fn = uint64_t (*)(const char*);
  static const count_fn count = lookup<count_fn>("simcuda_call_count");
  return count == nullptr ? 0 : count(name);
}

bool simcuda_settle(void* stream) {
  using settle_fn = int (*)(void*);
  static const settle_fn settle = lookup<settle_fn>("simcuda_stream_settle");
  if (settle == nullptr) return false;
  settle(stream);  // a handle that is not a live stream is a simcuda violation: the test fails
  return true;
}

void reset_simcuda_calls() {
  using reset_fn = void (*)();
  static const reset_fn reset = lookup<reset_fn>("simcuda_reset_call_counts");
  if (reset != nullptr) reset();
}

uint64_t simcuda_primary_contexts(int device) {
  using count_fn = uint64_t (*)(int);
  static const count_fn count = lookup<count_fn>("simcuda_primary_contexts");
  return count == nullptr ? 0 : count(device);
}

uint64_t simcuda_primary_retains(int device) {
  using count_fn = uint64_t (*)(int);
  static const count_fn count = lookup<count_fn>("simcuda_primary_retains");
  return count == nullptr ? 0 : count(device);
}

uint64_t simcuda_hidden_waits() {
  using count_fn = uint64_t (*)();
  static const count_fn count = lookup<count_fn>("simcuda_hidden_waits");
  return count == nullptr ? 0 : count();
}

uint64_t simcuda_unverified_warnings() {
  using count_fn = uint64_t (*)();
  static const count_fn count = lookup<count_fn>("simcuda_unverified_warnings");
  return count == nullptr ? 0 : count();
}

bool simcuda_fail_next(const char* name, int error) {
  using fail_fn = int (*)(const char*, int);
  static const fail_fn fail = lookup<fail_fn>("simcuda_fail_next");
  return fail != nullptr && fail(name, error) != 0;
}

bool simcuda_unload_driver() {
  using unload_fn = void (*)();
  static const unload_fn unload = lookup<unload_fn>("simcuda_unload_driver");
  if (unload == nullptr) return false;
  unload();
  return true;
}

bool simcuda_delay_calls(const char* name, unsigned milliseconds) {
  using delay_fn = int (*)(const char*, unsigned);
  static const delay_fn delay = lookup<delay_fn>("simcuda_delay_calls");
  return delay != nullptr && delay(name, milliseconds) != 0;
}

uint64_t simcuda_destructors_run(uint64_t* longest_us) {
  using run_fn = uint64_t (*)(uint64_t*);
  static const run_fn run = lookup<run_fn>("simcuda_destructors_run");
  if (longest_us != nullptr) *longest_us = 0;
  return run == nullptr ? 0 : run(longest_us);
}

}  // namespace arcpool::test
