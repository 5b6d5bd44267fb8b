// Fill / verify / poison / spin on either driver, so that the stress program and the ordering
// tests are written once: device kernels on the CUDA driver, stream-ordered host work on the
// host driver. Host-only header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "arcpool/arcpool.h"

namespace arcpool::kernels {

class workload {
 public:
  virtual ~workload() = default;

  /// The driver this workload runs on.
  virtual arcpool_driver_kind_t driver() const = 0;
  /// Writes the pattern of `tag` over [p, p + bytes) in stream order on `s`.
  virtual arcpool_status_t fill(void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                                arcpool_stream_t s) = 0;
  /// Checks [p, p + bytes) against the pattern of `tag` in stream order on `s`; mismatches add
  /// to mismatches().
  virtual arcpool_status_t verify(const void* p, size_t bytes, uint64_t tag, uint64_t first_word,
                                  arcpool_stream_t s) = 0;
  /// Overwrites [p, p + bytes) with kPoisonWord in stream order on `s`.
  virtual arcpool_status_t poison(void* p, size_t bytes, arcpool_stream_t s) = 0;
  /// Keeps `s` busy for `nanoseconds`.
  virtual arcpool_status_t spin(uint64_t nanoseconds, arcpool_stream_t s) = 0;
  /// Makes later work on `waiter` wait for the work queued on `target` so far (what an
  /// application does before using a buffer on another stream, e.g. torch's wait_stream).
  virtual arcpool_status_t wait_stream(arcpool_stream_t waiter, arcpool_stream_t target) = 0;
  /// Memory that arcpool did not allocate, usable on any stream when this returns (null on
  /// failure). Give it back with foreign_free, or import it with foreign_free as on_free.
  virtual void* foreign_allocate(size_t bytes) = 0;
  /// An arcpool_on_free_t giving foreign_allocate's memory back (user_data: the workload).
  static void foreign_free(void* pointer, size_t bytes, void* user_data);
  /// Words found wrong by every verify that has run (synchronize the streams first).
  virtual uint64_t mismatches() = 0;
  /// Words checked by every verify that has run.
  virtual uint64_t verified_words() = 0;

  /// An arcpool_before_free_t poisoning every freed block (user_data: the workload).
  static void poison_before_free(void* pointer, size_t bytes, arcpool_stream_t stream,
                                 void* user_data);

 protected:
  virtual void release_foreign(void* pointer, size_t bytes) = 0;
};

/// Host work on `allocator`'s streams (a host-driver allocator). Borrowed: it must outlive the
/// workload.
std::unique_ptr<workload> make_host_workload(arcpool_allocator_t* allocator);

/// Device kernels on the current device. Null when arcpool was built without kernels.
std::unique_ptr<workload> make_cuda_workload();

/// The workload matching `allocator`'s driver (null if that driver has none here).
std::unique_ptr<workload> make_workload(arcpool_allocator_t* allocator);

}  // namespace arcpool::kernels
