"""arcpool.cupy's hooks in the order CuPy calls them, on simcuda (the CUDA runtime simulator).

CuPy itself needs a GPU (test_cupy.py). Here a stand-in gives arcpool.cupy what it reads of
CuPy: the current stream, whose CUDA stream is destroyed when the Python object dies (as
cupy.cuda.Stream.__del__ does), and the memory classes that own an allocation. Runs only on
simcuda, whose violations report a use of a destroyed stream.
"""
import ctypes
import gc
import sys
import types
import unittest
import warnings


def _simcuda():
    try:
        runtime = ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
        runtime.simcuda_take_violations  # only simcuda has it
        return runtime
    except (OSError, AttributeError):
        return None


RUNTIME = _simcuda()


class _Stream:
    """cupy.cuda.Stream: a CUDA stream destroyed when the object dies. (Its captures, which
    arcpool.cupy.install() wraps, are test_cupy_graphs.py's.)"""

    current = None

    def __init__(self):
        handle = ctypes.c_void_p()
        assert RUNTIME.cudaStreamCreateWithFlags(ctypes.byref(handle), 1) == 0
        self.ptr, self.device_id = handle.value, 0

    def __del__(self):
        RUNTIME.cudaStreamDestroy(ctypes.c_void_p(self.ptr))

    def begin_capture(self, mode=None):
        assert RUNTIME.cudaStreamBeginCapture(ctypes.c_void_p(self.ptr),
                                              2 if mode is None else mode) == 0

    def end_capture(self):
        graph = ctypes.c_void_p()
        assert RUNTIME.cudaStreamEndCapture(ctypes.c_void_p(self.ptr), ctypes.byref(graph)) == 0
        return graph.value


class _BlockingStream(_Stream):
    """cupy.cuda.Stream() as CuPy makes it by default: a blocking stream, which the legacy (null)
    stream synchronizes with."""

    def __init__(self):
        handle = ctypes.c_void_p()
        assert RUNTIME.cudaStreamCreateWithFlags(ctypes.byref(handle), 0) == 0
        self.ptr, self.device_id = handle.value, 0


class _ExternalStream(_Stream):
    """cupy.cuda.ExternalStream: a stream CuPy neither made nor destroys."""

    def __init__(self, ptr, device_id=-1):
        self.ptr, self.device_id = ptr, device_id

    def __del__(self):
        pass


class _NullStream:
    ptr = 0


def _fake_cupy():
    cupy = types.ModuleType("cupy")
    cuda = types.SimpleNamespace()

    class Device:
        def __init__(self, device=0):
            self.id = device

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class UnownedMemory:
        def __init__(self, ptr, size, owner, device):
            self.ptr, self.size, self.owner, self.device = ptr, size, owner, device

    class MemoryPointer:
        def __init__(self, mem, offset):
            self.mem, self.offset = mem, offset

    class OutOfMemoryError(MemoryError):  # cupy.cuda.memory's, with its arguments
        def __init__(self, size, total, limit=0):
            super().__init__(f"Out of memory allocating {size:,} bytes "
                             f"(allocated so far: {total:,} bytes).")

    cuda.Device = Device
    cuda.Stream, cuda.ExternalStream = _Stream, _ExternalStream
    cuda.get_current_stream = lambda: _Stream.current or _NullStream()
    cuda.memory = types.SimpleNamespace(UnownedMemory=UnownedMemory, MemoryPointer=MemoryPointer,
                                        OutOfMemoryError=OutOfMemoryError)
    cuda.set_allocator = lambda fn: None
    cupy.cuda = cuda
    return cupy


def _take_violations():
    buf = ctypes.create_string_buffer(1 << 16)
    RUNTIME.simcuda_take_violations.restype = ctypes.c_uint64
    RUNTIME.simcuda_take_violations(buf, ctypes.c_size_t(len(buf)))
    return buf.value.decode()


@unittest.skipUnless(RUNTIME is not None, "needs simcuda (the simcuda presets)")
class CupyHooksOnSimcuda(unittest.TestCase):
    def setUp(self):
        self._saved = sys.modules.get("cupy")
        sys.modules["cupy"] = _fake_cupy()
        import arcpool.cupy

        self.malloc = arcpool.cupy.install()
        _take_violations()
        # A free that fails warns in __del__, where an exception (warnings as errors) would only
        # be printed: every warning is recorded instead, and fails the test at its end.
        self._recording = warnings.catch_warnings(record=True)
        self._warned = self._recording.__enter__()
        warnings.simplefilter("always")

    def tearDown(self):
        _Stream.current = None
        gc.collect()  # arrays of the test die now, warning here if their free fails
        import arcpool.cupy

        parked = list(arcpool.cupy._parked)  # frees still waiting for a capture's end
        arcpool.cupy._parked.clear()  # not carried into later tests
        self._recording.__exit__(None, None, None)
        if self._saved is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = self._saved
        self.assertEqual([], [str(w.message) for w in self._warned])
        self.assertEqual([], parked)

    def test_an_array_that_outlives_its_stream_is_freed_without_touching_it(self):
        # As in test_cupy.py: allocate under `with stream:`, leave it, drop the stream, and the
        # array dies later, freed on the then-current (null) stream.
        from arcpool import cupy as arcpool_cupy

        _Stream.current = _Stream()
        before = arcpool_cupy.stats()["allocated_bytes.all.current"]
        array = self.malloc(1 << 20)
        _Stream.current = None  # the stream object's last reference: CuPy would destroy it here
        del array  # the free runs on the null stream
        self.assertEqual(before, arcpool_cupy.stats()["allocated_bytes.all.current"])
        self.assertEqual("", _take_violations())

    def test_running_out_of_memory_is_cupys_out_of_memory_error(self):
        # Code that backs off on CuPy's out-of-memory catches cupy.cuda.memory.OutOfMemoryError.
        import cupy

        with self.assertRaises(cupy.cuda.memory.OutOfMemoryError) as caught:
            self.malloc(1 << 62)
        self.assertIn("Out of memory allocating", str(caught.exception))
        self.assertIn("arcpool: ARCPOOL_STATUS_OUT_OF_MEMORY", str(caught.exception))
        self.assertEqual("", _take_violations())

    def test_an_array_collected_while_an_unknown_stream_captures_is_freed_on_its_own(self):
        # Inside CuPy's stream.begin_capture(), an older array dies: arcpool cannot free it on the
        # capturing stream (not arcpool's, so it could not fence it after the graph), and frees
        # it on the stream it was allocated on, as CuPy's MemoryAsync does; never a silent leak.
        from arcpool import cupy as arcpool_cupy

        own = _Stream()
        _Stream.current = own
        array = self.malloc(1 << 20)
        before = arcpool_cupy.stats()["allocated_bytes.all.current"]
        capturing = _Stream()
        self.assertEqual(0, RUNTIME.cudaStreamBeginCapture(ctypes.c_void_p(capturing.ptr), 1))
        _Stream.current = capturing
        del array  # a warning fails the test (tearDown)
        _Stream.current = None
        graph = ctypes.c_void_p()
        self.assertEqual(0, RUNTIME.cudaStreamEndCapture(ctypes.c_void_p(capturing.ptr),
                                                         ctypes.byref(graph)))
        RUNTIME.cudaGraphDestroy(graph)
        self.assertEqual(before - (1 << 20), arcpool_cupy.stats()["allocated_bytes.all.current"])
        del own, capturing
        self.assertEqual("", _take_violations())

    def test_an_array_of_the_null_stream_collected_in_a_blocking_capture_is_freed_after_it(self):
        # While a blocking stream captures, the null (legacy) stream can neither be asked whether
        # it captures nor take work (cudaErrorStreamCaptureImplicit): arcpool refuses the free on
        # the capturing stream and on the null stream. It is retried once the capture ends; it
        # was left allocated for ever, with a warning.
        from arcpool import cupy as arcpool_cupy

        _Stream.current = None  # the null stream
        before = arcpool_cupy.stats()["allocated_bytes.all.current"]
        array = self.malloc(1 << 20)
        blocking = _BlockingStream()
        blocking.begin_capture()  # wrapped by install(): registered, bound to a graph pool
        _Stream.current = blocking
        del array
        _Stream.current = None
        self.assertEqual(before + (1 << 20), arcpool_cupy.stats()["allocated_bytes.all.current"])
        graph = blocking.end_capture()
        RUNTIME.cudaGraphDestroy(ctypes.c_void_p(graph))
        self.assertEqual(before, arcpool_cupy.stats()["allocated_bytes.all.current"])
        del blocking
        self.assertEqual("", _take_violations())

    def test_a_parked_free_that_fails_otherwise_is_reported_without_raising(self):
        # The retry runs inside malloc and end_capture: with warnings made errors (-W error) a
        # raise there failed an unrelated allocation, or lost the graph end_capture returns.
        import contextlib
        import io

        from arcpool import cupy as arcpool_cupy

        arcpool_cupy._parked.append((0xDEAD000, 4096, 0, _NullStream()))  # unknown to arcpool
        stderr = io.StringIO()
        with warnings.catch_warnings(), contextlib.redirect_stderr(stderr):
            warnings.simplefilter("error")
            arcpool_cupy._retry_parked()
        self.assertEqual([], arcpool_cupy._parked)
        self.assertIn("4096 bytes at 0xdead000 stay allocated", stderr.getvalue())

    def test_memory_held_by_a_reference_cycle_is_collected_before_out_of_memory(self):
        # CuPy's own pool runs the garbage collector and retries before it raises: arrays in
        # reference cycles hold their memory until it runs.
        import arcpool
        from arcpool import _lib

        allocator = arcpool.default_allocator(0)
        limit = 4 << 20
        in_use = arcpool.stats()["arcpool.bytes_held_current"]
        _lib.lib.arcpool_allocator_set_hard_limit.argtypes = [_lib.ctypes.c_void_p,
                                                              _lib.ctypes.c_size_t]
        self.assertEqual(0, _lib.lib.arcpool_allocator_set_hard_limit(allocator, in_use + limit))
        gc.disable()
        try:
            cycle = [self.malloc(3 << 20)]
            cycle.append(cycle)  # only the collector frees it
            del cycle
            array = self.malloc(3 << 20)  # fits once the cycle's array is freed
            del array
        finally:
            gc.enable()
            self.assertEqual(0, _lib.lib.arcpool_allocator_set_hard_limit(allocator, 0))
        self.assertEqual("", _take_violations())

    def test_zero_size_arrays_need_no_stream(self):
        _Stream.current = _Stream()
        empty = self.malloc(0)
        _Stream.current = None
        del empty
        self.assertEqual("", _take_violations())


if __name__ == "__main__":
    unittest.main()
