// What a test can ask simcuda, the CUDA runtime simulator (tests/simcuda/simcuda.h), when it
// runs on it. Looked up at run time, so the same binary runs on the real runtime. Needs only
// the C library: the CUDA conformance suite uses it too.
#pragma once

#include <cstdint>
#include <string>

namespace arcpool::test {

/// Whether the CUDA runtime in this process is simcuda.
bool on_simcuda();

/// Takes simcuda's violations so far ("" when none, or not on simcuda).
std::string take_simcuda_violations();

/// simcuda's count of calls to `name` (0 when not on simcuda).
uint64_t simcuda_calls(const char* name);

/// On simcuda, lets the stream with handle `stream` run as far as it can (see
/// simcuda_stream_settle) and returns true; elsewhere returns false at once.
bool simcuda_settle(void* stream);

/// Resets simcuda's call counters (no effect when not on simcuda).
void reset_simcuda_calls();

/// Primary contexts simcuda created on `device` (0 when not on simcuda).
uint64_t simcuda_primary_contexts(int device);

/// cuDevicePrimaryCtxRetain calls on `device` not yet released (0 when not on simcuda).
uint64_t simcuda_primary_retains(int device);

/// Waits simcuda's pools inserted between streams to reuse memory (0 when not on simcuda).
uint64_t simcuda_hidden_waits();

/// simcuda's warnings of unverified rules so far, such as a potentially unsafe call while a
/// capture prohibits them (0 when not on simcuda).
uint64_t simcuda_unverified_warnings();

/// On simcuda, makes the next call of `name` fail with cudaError_t `error` and returns true;
/// elsewhere returns false.
bool simcuda_fail_next(const char* name, int error);

/// On simcuda, unloads the simulated driver for good (see simcuda_unload_driver: every later
/// CUDA call fails as at a process's exit) and returns true; elsewhere returns false.
bool simcuda_unload_driver();

/// On simcuda, makes every later call of `name` pause for `milliseconds` (0: no more) with the
/// runtime unlocked (see simcuda_delay_calls) and returns true; elsewhere, or for a call without
/// a pause point, returns false.
bool simcuda_delay_calls(const char* name, unsigned milliseconds);

/// User-object destructors simcuda ran so far, with the longest one's time in microseconds in
/// `*longest_us` (0 and 0 when not on simcuda).
uint64_t simcuda_destructors_run(uint64_t* longest_us);

}  // namespace arcpool::test
