// The tag pattern written by fill and checked by verify, shared by the device kernels and the
// host-driver implementation. Word i of an allocation holds the index mixed with the
// allocation's tag: a stale block (another tag) and a shifted one (another index) both mismatch.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ARCPOOL_HOST_DEVICE __host__ __device__
#else
#define ARCPOOL_HOST_DEVICE
#endif

namespace arcpool::kernels {

/// What poison-on-free writes. A pattern word equals it with probability 2^-32.
inline constexpr uint32_t kPoisonWord = 0xDEADBEEFu;

/// The 32-bit form of a 64-bit allocation tag (splitmix64 finalizer), computed once per call.
ARCPOOL_HOST_DEVICE inline uint32_t tag_word(uint64_t tag) {
  uint64_t x = tag + 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

/// Word `i` of the pattern: one multiply and two xors, cheap enough to run at memory speed.
ARCPOOL_HOST_DEVICE inline uint32_t pattern_word(uint32_t tag_word, uint64_t i) {
  return (static_cast<uint32_t>(i) * 0x9E3779B1u) ^ static_cast<uint32_t>(i >> 32) ^ tag_word;
}

}  // namespace arcpool::kernels
