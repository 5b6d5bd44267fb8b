"""arcpool as CuPy's allocator: allocations and frees on CuPy's current stream.

    import arcpool.cupy
    arcpool.cupy.install()

CuPy's allocator hook passes no stream; this one reads CuPy's current stream on every call, so
memory is stream-ordered the way CuPy's own MemoryAsyncPool is. Callers that cannot read a
stream use the ambient-stream policy of the C API (arcpool_allocator_set_ambient_stream).
"""
import gc
import warnings

from . import _lib

_installed = None


class _Block:
    """Owns one arcpool allocation; frees it on CuPy's then-current stream when it dies (on its
    own stream when the current one refuses the free; a warning, never silence, if both do).

    It also holds the CuPy stream it was allocated on: cupy.cuda.Stream destroys its CUDA stream
    in __del__, and arrays routinely outlive their stream, but arcpool's free fences the
    allocation's stream (its current stream, which the caller must keep alive). Holding the
    object keeps that stream alive until the free has returned.
    """

    def __init__(self, cupy, pointer, size, device, stream):
        self._cupy, self.pointer, self.size, self.device = cupy, pointer, size, device
        self._stream = stream

    def __del__(self):
        with self._cupy.cuda.Device(self.device):  # that device's current stream
            stream = self._cupy.cuda.get_current_stream().ptr
        free = _lib.lib.arcpool_free_async
        status = free(self.pointer, self.size, self.device, stream)
        if status != 0 and self._stream is not None and self._stream.ptr != stream:
            # The current stream can be one arcpool cannot free on: capturing a graph, and not
            # arcpool's (an array collected inside stream.begin_capture()). Then the free goes
            # on the allocation's own stream, as CuPy's MemoryAsync frees.
            status = free(self.pointer, self.size, self.device, self._stream.ptr)
        if status != 0:
            warnings.warn(f"arcpool.cupy: {self.size} bytes at {self.pointer:#x} stay allocated: "
                          f"{_lib.lib.arcpool_last_error().decode()}", RuntimeWarning)
        self._stream = None  # the allocation's stream may go now


def _out_of_memory():
    """Whether the failed call ran out of memory (arcpool's last error says so)."""
    return _lib.lib.arcpool_last_error().startswith(b"ARCPOOL_STATUS_OUT_OF_MEMORY")


def _failure(cupy, size, device):
    """The exception for a failed allocation: CuPy's OutOfMemoryError (a MemoryError, which
    code that backs off on CuPy's out-of-memory catches) with arcpool's reason when arcpool ran
    out of memory, RuntimeError with arcpool's message otherwise (a capturing stream, a bad
    device)."""
    reason = _lib.lib.arcpool_last_error().decode()
    if not _out_of_memory():
        return RuntimeError("arcpool: " + reason)
    from . import stats

    error = cupy.cuda.memory.OutOfMemoryError(size, stats(device)["allocated_bytes.all.current"])
    error.args = (f"{error.args[0]}; arcpool: {reason}",)
    return error


def install():
    """Makes arcpool CuPy's allocator (cupy.cuda.set_allocator). Returns the malloc function."""
    global _installed
    import cupy

    def malloc(size):
        device = cupy.cuda.Device().id
        if size == 0:
            return cupy.cuda.memory.MemoryPointer(
                cupy.cuda.memory.UnownedMemory(0, 0, None, device), 0)
        stream = cupy.cuda.get_current_stream()
        pointer = _lib.lib.arcpool_malloc_async(size, device, stream.ptr)
        if not pointer and _out_of_memory():
            # Arrays held in reference cycles keep their memory until the garbage collector
            # runs: collect them and retry once, as CuPy's own pool does (_try_malloc).
            gc.collect()
            pointer = _lib.lib.arcpool_malloc_async(size, device, stream.ptr)
        if not pointer:
            raise _failure(cupy, size, device)
        block = _Block(cupy, pointer, size, device, stream)
        return cupy.cuda.memory.MemoryPointer(
            cupy.cuda.memory.UnownedMemory(pointer, size, block, device), 0)

    cupy.cuda.set_allocator(malloc)
    _installed = malloc
    return malloc


def stats(device=0):
    """arcpool's statistics (see arcpool.stats)."""
    from . import stats as arcpool_stats

    return arcpool_stats(device)
