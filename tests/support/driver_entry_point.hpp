// Driver API functions reached through the CUDA runtime (cudaGetDriverEntryPointByVersion), as
// arcpool reaches them: the same test binary then runs on the real runtime and on simcuda. For
// tests of contexts (design.md §6) and the CUDA conformance suite.
#pragma once

#include <cuda.h>

namespace arcpool::test {

/// The driver function `symbol` (`version`: the CUDA version whose signature the caller uses;
/// cuCtxCreate's changed in 13.0); a test failure and null when it is not found.
void* driver_entry_point(const char* symbol, unsigned version = 12000);

/// driver_entry_point cast to `Fn`.
template <class Fn>
Fn driver_function(const char* symbol, unsigned version = 12000) {
  return reinterpret_cast<Fn>(driver_entry_point(symbol, version));
}

/// The context current on the calling thread; a test failure (and null) when cuCtxGetCurrent
/// fails.
CUcontext current_context();

}  // namespace arcpool::test
