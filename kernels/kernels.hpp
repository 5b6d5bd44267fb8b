// Host launchers of arcpool's device kernels (fill / verify / poison / spin). Host-only header:
// callers need no nvcc. Every launcher checks the launch and returns its error.
//
// Sizes are in bytes; fill and verify cover the whole 32-bit words of the range (a trailing
// partial word is left alone). `first_word` is the pattern index of the range's first word,
// so that a view [offset, offset + n) verifies with first_word = offset / 4.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace arcpool::kernels {

/// Counters a verify adds to; in device-accessible memory. Initialize first_bad_word to
/// UINT64_MAX.
struct verify_counters {
  unsigned long long mismatches;      ///< words that did not match
  unsigned long long first_bad_word;  ///< lowest mismatching pattern index seen
  unsigned long long words;           ///< words verified
};

/// Writes the pattern of `tag` over [p, p + bytes) on `s`, in 16-byte stores. `p` must be
/// 4-byte aligned (as for verify_async and poison_async): cudaErrorInvalidValue otherwise.
cudaError_t fill_async(void* p, size_t bytes, uint64_t tag, uint64_t first_word, cudaStream_t s);

/// Counts mismatches of [p, p + bytes) against the pattern of `tag` into `*counters` (one
/// atomic per block, CUB block reduction).
cudaError_t verify_async(const void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                         verify_counters* counters, cudaStream_t s);

/// Overwrites [p, p + bytes) with kPoisonWord on `s`.
cudaError_t poison_async(void* p, size_t bytes, cudaStream_t s);

/// Keeps `s` busy for `nanoseconds` (one thread reading %globaltimer).
cudaError_t spin_async(uint64_t nanoseconds, cudaStream_t s);

}  // namespace arcpool::kernels
