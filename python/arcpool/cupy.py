"""arcpool as CuPy's allocator: allocations and frees on CuPy's current stream.

    import arcpool.cupy
    arcpool.cupy.install()

CuPy's allocator hook passes no stream; this one reads CuPy's current stream on every call, so
memory is stream-ordered the way CuPy's own MemoryAsyncPool is. Callers that cannot read a
stream use the ambient-stream policy of the C API (arcpool_allocator_set_ambient_stream).

CUDA graphs: install() wraps Stream.begin_capture and end_capture (cupy.cuda.Stream's and
ExternalStream's). For the capture, the stream is registered with the device's allocator and
the capture is bound to a graph pool of its own (docs/graphs.md, "CuPy's captures"): arrays made
in the capture are blocks reserved outside it, so the graph launches any number of times, and
the pool's memory goes back once the graph is gone and its arrays are freed.
"""
import atexit
import ctypes
import gc
import sys
import warnings

from . import _lib

_installed = None
# Frees refused while a capture runs, retried once a wrapped capture ends, at the next
# allocation, and at the interpreter's exit: (pointer, size, device, the allocation's CuPy
# stream).
_parked = []


def _refused_during_a_capture():
    """Whether the failed free was refused for a capture (UNSUPPORTED): it may pass later."""
    return _lib.lib.arcpool_last_error().startswith(b"ARCPOOL_STATUS_UNSUPPORTED")


def _retry_parked(last_chance=False):
    """Retries the parked frees on their own streams; keeps those still refused for a capture
    (unless `last_chance`), and reports (and forgets) the others. Never raises: a warning made an
    error (-W error) is written to stderr, as in __del__, and the frees kept stay parked."""
    kept, lost = [], []
    try:
        while _parked:
            try:
                pointer, size, device, stream = item = _parked.pop()
            except IndexError:  # emptied by another thread meanwhile
                break
            if _lib.lib.arcpool_free_async(pointer, size, device, stream.ptr) == 0:
                continue
            if _refused_during_a_capture() and not last_chance:
                kept.append(item)
            else:
                lost.append(f"arcpool.cupy: {size} bytes at {pointer:#x} stay allocated: "
                            f"{_lib.lib.arcpool_last_error().decode()}")
    finally:
        _parked.extend(kept)
    for message in lost:
        try:
            warnings.warn(message, RuntimeWarning)
        except Warning:
            print(message, file=sys.stderr)


# A free still refused at the interpreter's exit is tried once more, and reported if it fails.
atexit.register(_retry_parked, last_chance=True)


class _Block:
    """Owns one arcpool allocation; frees it on CuPy's then-current stream when it dies (on its
    own stream when the current one refuses the free; after the capture when both refuse it for
    one; a warning, never silence, if both refuse it otherwise).

    It also holds the CuPy stream it was allocated on: cupy.cuda.Stream destroys its CUDA stream
    in __del__, and arrays routinely outlive their stream, but arcpool's free fences the
    allocation's stream (its current stream, which the caller must keep alive). Holding the
    object keeps that stream alive until the free has returned. An ExternalStream owns no CUDA
    stream: its owner must keep the stream alive until the arrays made on it are freed.
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
        if status != 0 and self._stream is not None and _refused_during_a_capture():
            # E.g. an array of the null stream collected in a capture of a blocking stream
            # (cupy.cuda.Stream()'s default): while it captures, the legacy stream can take no
            # work (cudaErrorStreamCaptureImplicit). Retried after the capture.
            _parked.append((self.pointer, self.size, self.device, self._stream))
        elif status != 0:
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
        if _parked:
            _retry_parked()
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
    _capture_into_graph_pools(cupy)
    _installed = malloc
    return malloc


def _capture_into_graph_pools(cupy):
    """Wraps begin_capture and end_capture of cupy.cuda.Stream and ExternalStream: from just
    before the capture begins until just after it ends the stream is registered with the
    device's allocator (arcpool acts on a capturing stream only if it created or registered it),
    and the capture is bound to a new graph pool, whose handle is released at the end (the pool
    lives on while its graph and its blocks do)."""
    lib = _lib.lib
    # stream pointer -> (allocator, pool), from begin_capture until end_capture. Keyed by the
    # CUDA stream, not the object: CuPy lets several objects share one ("the ptr may be shared
    # between multiple Stream instances", _BaseStream.__eq__), and a capture begun through one
    # may end through another. Not by its device: an ExternalStream's (device_id -1) is the
    # current device, which the captured code may change before the end. A CUDA stream handle
    # names one stream in the process.
    captures = {}

    def device_of(stream):
        return stream.device_id if stream.device_id >= 0 else cupy.cuda.Device().id

    def undo(stream, allocator, pool):
        """Unbinds, releases and unregisters; the first failure's status, or 0."""
        statuses = (lib.arcpool_graph_pool_end(pool, stream.ptr),
                    lib.arcpool_graph_pool_release(pool),
                    lib.arcpool_stream_unregister(allocator, stream.ptr))
        return next((status for status in statuses if status != 0), 0)

    def wrap(cls):
        begin, end = cls.begin_capture, cls.end_capture
        if getattr(begin, "_arcpool_wrapped", False):
            return

        def begin_capture(self, mode=None):
            if self.ptr in (0, 1, 2):  # the legacy and per-thread default streams: left to CuPy
                return begin(self, mode)
            allocator = _lib.default_allocator(device_of(self))
            pool = ctypes.c_void_p()
            _lib.check(lib.arcpool_graph_pool_create(allocator, ctypes.byref(pool)),
                       "arcpool_graph_pool_create")
            status = lib.arcpool_stream_register(allocator, self.ptr)
            if status != 0:
                lib.arcpool_graph_pool_release(pool)
                _lib.check(status, "registering the capture stream")
            try:
                begin(self, mode)
            except BaseException:
                lib.arcpool_graph_pool_release(pool)
                lib.arcpool_stream_unregister(allocator, self.ptr)
                raise
            status = lib.arcpool_graph_pool_begin(pool, self.ptr)
            if status != 0:
                error = _lib.ArcpoolError(status, "binding the capture to a graph pool")
                try:
                    end(self)  # the capture is abandoned: nothing was allocated in it
                finally:
                    lib.arcpool_graph_pool_release(pool)
                    lib.arcpool_stream_unregister(allocator, self.ptr)
                raise error
            captures[self.ptr] = (allocator, pool)

        def end_capture(self):
            allocator, pool = captures.pop(self.ptr, (None, None))
            if allocator is None:
                graph = end(self)
                _retry_parked()
                return graph
            try:
                graph = end(self)
            except BaseException:
                undo(self, allocator, pool)  # CuPy's error first
                raise
            _lib.check(undo(self, allocator, pool), "ending the capture's graph pool")
            _retry_parked()
            return graph

        begin_capture._arcpool_wrapped = True
        cls.begin_capture, cls.end_capture = begin_capture, end_capture

    for cls in (cupy.cuda.Stream, cupy.cuda.ExternalStream):
        wrap(cls)


def stats(device=0):
    """arcpool's statistics (see arcpool.stats)."""
    from . import stats as arcpool_stats

    return arcpool_stats(device)
