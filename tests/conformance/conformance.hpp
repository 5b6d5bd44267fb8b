// The CUDA conformance suite's helpers: written against the CUDA runtime API alone, so the same
// binary runs on the real runtime (on a GPU) and on simcuda (through LD_LIBRARY_PATH). Where
// they disagree, simcuda is wrong. Checks of simcuda's own counters and violations skip on
// the real runtime.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "support/driver_entry_point.hpp"
#include "support/simcuda_probe.hpp"

namespace conformance {

/// Skips (or fails under ARCPOOL_REQUIRE_GPU=1) without a CUDA device.
#define CONFORMANCE_REQUIRE_DEVICE()                                                    \
  do {                                                                                  \
    if (const std::string why = ::conformance::no_device_reason(); !why.empty()) {      \
      if (::conformance::gpu_required()) FAIL() << "ARCPOOL_REQUIRE_GPU=1 but " << why; \
      GTEST_SKIP() << "no CUDA device: " << why;                                        \
    }                                                                                   \
  } while (0)

/// Skips unless the runtime is simcuda (for checks of its counters and violations).
#define CONFORMANCE_SIMCUDA_ONLY()                                                             \
  do {                                                                                         \
    if (!::arcpool::test::on_simcuda()) GTEST_SKIP() << "simcuda's own check: not on simcuda"; \
  } while (0)

bool gpu_required();
std::string no_device_reason();
using arcpool::test::driver_function;
using arcpool::test::on_simcuda;
using arcpool::test::simcuda_calls;
using arcpool::test::simcuda_hidden_waits;
using arcpool::test::simcuda_primary_contexts;
using arcpool::test::simcuda_settle;
using arcpool::test::take_simcuda_violations;

/// Mapped page-locked words for gates and markers, allocated once (a page-locked allocation
/// may synchronize implicitly, so none is made while a gate holds a stream).
class words {
 public:
  words();
  ~words();
  words(const words&) = delete;
  words& operator=(const words&) = delete;

  /// Holds `s` until open(i) (cuStreamWaitValue32 on word i).
  void gate(cudaStream_t s, int i);
  void open(int i);
  /// Sets word i when `s` reaches this point (cuStreamWriteValue32).
  void mark(cudaStream_t s, int i);
  bool reached(int i) const;
  /// Gives every stream 20 ms to run (a missing dependency shows as a reached marker).
  static void settle();

 private:
  uint32_t* host_ = nullptr;
  CUdeviceptr device_ = 0;
};

/// The fixture: checks for a device, resets the thread's capture mode, and fails on simcuda
/// violations the test did not take.
class Conformance : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
};

}  // namespace conformance
