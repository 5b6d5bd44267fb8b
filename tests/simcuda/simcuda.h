/* simcuda's control interface: what a test asks the simulated CUDA runtime beyond CUDA's own
 * API. Binaries never link these: they look them up with dlsym(RTLD_DEFAULT, ...), so the same
 * binary runs on the real runtime (where the lookup finds nothing) and on simcuda.
 * See docs/simcuda.md. */
#ifndef SIMCUDA_H
#define SIMCUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/** How many violations (undefined behaviour CUDA would not report) were found so far. */
uint64_t simcuda_violation_count(void);

/** Copies the violations not yet taken, one per line, into buf (at most size bytes, always
 * NUL-terminated when size > 0) and forgets them, so they no longer fail the process at exit.
 * Returns the number of violations taken. */
uint64_t simcuda_take_violations(char* buf, size_t size);

/** How many times the runtime function `name` (for example "cudaEventRecord") was called,
 * counting its _ptsz variant with it. */
uint64_t simcuda_call_count(const char* name);

/** Resets every call counter to zero. */
void simcuda_reset_call_counts(void);

/** Primary contexts created on `device` so far (cudaSetDevice creates one; cudaGetDevice
 * does not). */
uint64_t simcuda_primary_contexts(int device);

/** cuDevicePrimaryCtxRetain calls on `device` not yet released. */
uint64_t simcuda_primary_retains(int device);

/** Makes every later call of `name` pause for `milliseconds` (0: no more) at its pause point,
 * with the runtime's lock released, so that other threads can call in meanwhile: a test's
 * window for a race. Only two calls have a pause point: cudaEventQuery (at its start) and
 * cudaGraphRetainUserObject (with its graph in use, see docs/simcuda.md). Returns 1, or 0 for
 * another name. */
int simcuda_delay_calls(const char* name, unsigned milliseconds);

/** User-object destructors that have returned so far; the longest any ran, in microseconds,
 * goes to *longest_us unless it is null. */
uint64_t simcuda_destructors_run(uint64_t* longest_us);

/** Waits that pools inserted between streams to reuse memory (internal dependencies). */
uint64_t simcuda_hidden_waits(void);

/** Makes the next call of the runtime function or driver entry point `name` fail with the
 * cudaError_t `error` (a fault for tests). Returns 1, or 0 for a null name or cudaSuccess. */
int simcuda_fail_next(const char* name, int error);

/** Unloads the simulated CUDA driver, as a process's exit does once the driver is gone: every
 * later runtime call fails with cudaErrorCudartUnloading ("a CUDA Runtime API call cannot be
 * executed because it is being called during process shut down, at a point in time after CUDA
 * driver has been unloaded") and every driver entry point with CUDA_ERROR_DEINITIALIZED ("the
 * CUDA driver is in the process of shutting down"), each still counted. There is no way back:
 * a test calls it in a child process. */
void simcuda_unload_driver(void);

/** Lets `stream` run as far as it can, then returns: once it is idle, held by a stream memory
 * wait (cuStreamWaitValue32) whose condition is unmet, or waiting on streams that are settled
 * the same way and cannot go on. Then nothing queued on it can run without a further host
 * action. Returns 0, or -1 (with a violation) when `stream` is not a live stream. */
int simcuda_stream_settle(cudaStream_t stream);

/** Warnings of unverified rules so far (see docs/simcuda.md: they warn, never fail). */
uint64_t simcuda_unverified_warnings(void);

#ifdef __cplusplus
}
#endif

#endif /* SIMCUDA_H */
