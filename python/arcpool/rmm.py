"""arcpool as an RMM memory resource, for RAPIDS and anything that allocates through RMM.

    import arcpool.rmm
    mr = arcpool.rmm.memory_resource(device=0)   # an rmm.mr.CallbackMemoryResource
    buffer = rmm.DeviceBuffer(size=1 << 20, mr=mr)
    arcpool.rmm.install(device=0)                # rmm.mr.set_per_device_resource

The resource calls arcpool's by-pointer functions (arcpool_malloc_async / arcpool_free_async,
device's default allocator) on the stream RMM passes, read through the CUDA stream protocol
(`Stream.__cuda_stream__()`). Each allocation and free runs a Python function: RMM documents
CallbackMemoryResource as slow, so this suits RMM-based tools and tests more than hot loops; C++
code hands `arcpool::memory_resource` to RMM directly (include/arcpool/resource.hpp).
"""
import ctypes
import sys

from . import _lib


def _stream_handle(stream):
    """The cudaStream_t of an rmm Stream (0: the legacy default stream)."""
    return stream.__cuda_stream__()[1] if stream is not None else 0


def memory_resource(device=0):
    """An rmm.mr.CallbackMemoryResource that allocates from `device`'s default arcpool allocator,
    stream-ordered on the stream of each call. An allocation that ran out of memory raises
    MemoryError with arcpool's reason, which RMM turns into rmm::out_of_memory (what its
    failure-callback adaptors, cuDF's spilling among them, catch); any other failure (a bad
    stream or device, a capturing stream) raises RuntimeError, which RMM turns into
    std::runtime_error. Zero bytes give a null pointer, as RMM's own resources. A failed free is
    written to stderr and not raised: RMM calls it from C++ destructors, where an exception
    cannot go anywhere (it would stay pending, or end the process)."""
    import rmm.mr

    def allocate(size, stream):
        if size == 0:
            return 0
        pointer = _lib.lib.arcpool_malloc_async(size, device,
                                                ctypes.c_void_p(_stream_handle(stream)))
        if not pointer:
            reason = _lib.lib.arcpool_last_error().decode()
            if reason.startswith("ARCPOOL_STATUS_OUT_OF_MEMORY"):
                raise MemoryError(f"arcpool: {reason}")
            raise RuntimeError(f"arcpool: {reason}")
        return pointer

    def deallocate(pointer, size, stream):
        if pointer == 0:
            return
        status = _lib.lib.arcpool_free_async(ctypes.c_void_p(pointer), size, device,
                                             ctypes.c_void_p(_stream_handle(stream)))
        if status != 0:
            sys.stderr.write(f"arcpool.rmm: free of {pointer:#x} ({size} bytes) failed: "
                             f"{_lib.lib.arcpool_last_error().decode()}\n")

    return rmm.mr.CallbackMemoryResource(allocate, deallocate)


def install(device=0):
    """Makes memory_resource(device) RMM's resource for `device`
    (rmm.mr.set_per_device_resource) and returns it."""
    import rmm.mr

    mr = memory_resource(device)
    rmm.mr.set_per_device_resource(device, mr)
    return mr
