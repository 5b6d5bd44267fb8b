// Gates and markers: how tests prove ordering without sleeping. A gate blocks a stream until the
// test opens it; a marker tells whether a stream has reached a point.
#pragma once

#include <memory>

#include "arcpool/arcpool.h"

namespace arcpool::test {

/// Holds a stream until open() (idempotent). Opened on destruction.
class gate {
 public:
  virtual ~gate() = default;
  virtual void open() = 0;
};

/// Set once the stream reached the point where it was enqueued.
class marker {
 public:
  virtual ~marker() = default;
  virtual bool reached() const = 0;
};

/// Makes gates and markers for one driver.
class stream_probe {
 public:
  virtual ~stream_probe() = default;
  virtual std::unique_ptr<gate> block(arcpool_stream_t s) = 0;
  virtual std::shared_ptr<marker> mark(arcpool_stream_t s) = 0;
};

/// Host driver: queued host work waiting on a latch, and host work setting a flag.
std::unique_ptr<stream_probe> make_host_probe(arcpool_allocator_t* allocator);

/// Deterministic host driver: a latch its scheduler skips while closed (detail::deterministic
/// ::hold), and host work setting a flag.
std::unique_ptr<stream_probe> make_deterministic_probe(arcpool_allocator_t* allocator);

/// CUDA driver: cuStreamWaitValue32 / cuStreamWriteValue32 on mapped pinned memory, so a
/// blocked stream never occupies CUDA's host-callback thread.
std::unique_ptr<stream_probe> make_cuda_probe();

}  // namespace arcpool::test
