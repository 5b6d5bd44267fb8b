"""arcpool.cupy's capture wrapper (docs/graphs.md, "CuPy's captures") on real CUDA streams: a
stand-in for cupy.cuda's Stream whose begin_capture and end_capture make the CUDA runtime calls
CuPy's make, wrapped as arcpool.cupy.install() wraps CuPy's. Runs where arcpool's driver is CUDA
(a GPU, or simcuda: device-check, the simcuda presets); skips elsewhere. CuPy itself runs it in
tests/python/test_cupy.py on a GPU.
"""
import ctypes
import time
import types
import unittest

import arcpool
import arcpool.cupy as ac
import cuda_runtime

MIB = 1 << 20
_RELAXED = 2  # cudaStreamCaptureModeRelaxed, CuPy's default
_NON_BLOCKING = 1  # cudaStreamNonBlocking


def _check(error, what):
    if error != 0:
        raise AssertionError(f"{what} failed: CUDA error {error}")


class _Runtime:
    """The CUDA runtime calls the stand-in and the test make."""

    def __init__(self, cudart):
        self.rt = cudart

    def stream(self):
        handle = ctypes.c_void_p()
        _check(self.rt.cudaStreamCreateWithFlags(ctypes.byref(handle), _NON_BLOCKING),
               "cudaStreamCreateWithFlags")
        return handle.value

    def call(self, name, *args):
        _check(getattr(self.rt, name)(*args), name)

    def wait(self, to, frm):
        """Later work on stream `to` follows the work on `frm` so far (a fork or a join)."""
        event = ctypes.c_void_p()
        self.call("cudaEventCreateWithFlags", ctypes.byref(event), 2)  # cudaEventDisableTiming
        self.call("cudaEventRecord", event, ctypes.c_void_p(frm))
        self.call("cudaStreamWaitEvent", ctypes.c_void_p(to), event, 0)
        self.call("cudaEventDestroy", event)


def _stand_in_cupy(runtime):
    """cupy.cuda with Stream and ExternalStream whose captures call CUDA as CuPy's do."""

    class _BaseStream:
        def __init__(self, ptr, device_id=0):
            self.ptr, self.device_id = ptr, device_id

        def begin_capture(self, mode=None):
            runtime.call("cudaStreamBeginCapture", ctypes.c_void_p(self.ptr),
                         _RELAXED if mode is None else mode)

        def end_capture(self):
            graph = ctypes.c_void_p()
            runtime.call("cudaStreamEndCapture", ctypes.c_void_p(self.ptr), ctypes.byref(graph))
            return graph.value

    class Stream(_BaseStream):
        def __init__(self):
            super().__init__(runtime.stream())

    class ExternalStream(_BaseStream):
        pass

    current = types.SimpleNamespace(id=0)  # the current device, which a test may change
    cuda = types.SimpleNamespace(Stream=Stream, ExternalStream=ExternalStream,
                                 Device=lambda: current, current_device=current)
    return types.SimpleNamespace(cuda=cuda)


def _graph_pool_bytes():
    return arcpool.stats(0)["arcpool.graph_pool_bytes_current"]


@unittest.skipUnless(arcpool.DRIVER == "cuda" and cuda_runtime.load() is not None,
                     "arcpool's CUDA driver (a GPU or simcuda) and libcudart are not available")
class CuPyCaptureIntoGraphPools(unittest.TestCase):
    def setUp(self):
        self.runtime = _Runtime(cuda_runtime.load())
        self.cupy = _stand_in_cupy(self.runtime)
        ac._capture_into_graph_pools(self.cupy)
        self.lib = arcpool._lib.lib

    def test_a_captured_step_allocates_from_a_graph_pool_and_relaunches(self):
        # With graph memory instead (no pool), the output the graph keeps would make the second
        # launch fail (cudaErrorInvalidValue): pool blocks have no relaunch rule.
        s = self.cupy.cuda.Stream()
        before = _graph_pool_bytes()
        s.begin_capture()
        out = self.lib.arcpool_malloc_async(MIB, 0, s.ptr)  # CuPy's malloc on its stream
        self.assertTrue(out, self.lib.arcpool_last_error())
        tmp = self.lib.arcpool_malloc_async(MIB, 0, s.ptr)
        self.assertTrue(tmp, self.lib.arcpool_last_error())
        self.runtime.call("cudaMemsetAsync", ctypes.c_void_p(tmp), 7, ctypes.c_size_t(MIB),
                          ctypes.c_void_p(s.ptr))
        self.runtime.call("cudaMemcpyAsync", ctypes.c_void_p(out), ctypes.c_void_p(tmp),
                          ctypes.c_size_t(MIB), 3, ctypes.c_void_p(s.ptr))
        _check(self.lib.arcpool_free_async(tmp, MIB, 0, s.ptr), "arcpool_free_async")
        graph = s.end_capture()
        self.assertEqual(before + 2 * MIB, _graph_pool_bytes(), "blocks of a graph pool")
        exec_ = ctypes.c_void_p()
        self.runtime.call("cudaGraphInstantiate", ctypes.byref(exec_), ctypes.c_void_p(graph),
                          ctypes.c_ulonglong(0))
        host = (ctypes.c_ubyte * MIB)()
        for launch in range(3):
            self.runtime.call("cudaGraphLaunch", exec_, ctypes.c_void_p(s.ptr))
            self.runtime.call("cudaMemcpyAsync", host, ctypes.c_void_p(out), ctypes.c_size_t(MIB),
                              2, ctypes.c_void_p(s.ptr))
            self.runtime.call("cudaStreamSynchronize", ctypes.c_void_p(s.ptr))
            self.assertEqual((7, 7), (host[0], host[MIB - 1]), f"launch {launch}")
        _check(self.lib.arcpool_free_async(out, MIB, 0, s.ptr), "arcpool_free_async")
        self.runtime.call("cudaGraphExecDestroy", exec_)
        self.runtime.call("cudaGraphDestroy", ctypes.c_void_p(graph))
        deadline = time.time() + 10
        while _graph_pool_bytes() != before and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(before, _graph_pool_bytes(), "the pool's memory went back")
        self.runtime.call("cudaStreamSynchronize", ctypes.c_void_p(s.ptr))
        self.runtime.call("cudaStreamDestroy", ctypes.c_void_p(s.ptr))

    def test_a_stream_the_capture_forks_to_allocates_from_its_graph_pool(self):
        # A stream the capture forks to (it waits on an event recorded in the capture) is never
        # registered: its arrays are blocks of the capture's graph pool all the same
        # (docs/graphs.md, "Streams a capture forks to"). It was refused (UNSUPPORTED).
        s, side = self.cupy.cuda.Stream(), self.cupy.cuda.Stream()
        before = _graph_pool_bytes()
        s.begin_capture()
        self.runtime.wait(side.ptr, s.ptr)  # fork
        p = self.lib.arcpool_malloc_async(MIB, 0, side.ptr)
        self.assertTrue(p, self.lib.arcpool_last_error())
        self.runtime.call("cudaMemsetAsync", ctypes.c_void_p(p), 1, ctypes.c_size_t(MIB),
                          ctypes.c_void_p(side.ptr))
        _check(self.lib.arcpool_free_async(p, MIB, 0, side.ptr), "arcpool_free_async")
        self.runtime.wait(s.ptr, side.ptr)  # join
        graph = s.end_capture()
        self.assertEqual(before + MIB, _graph_pool_bytes(), "a block of the graph pool")
        self.runtime.call("cudaGraphDestroy", ctypes.c_void_p(graph))
        deadline = time.time() + 10
        while _graph_pool_bytes() != before and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(before, _graph_pool_bytes(), "the pool's memory went back")
        for stream in (s, side):
            self.runtime.call("cudaStreamSynchronize", ctypes.c_void_p(stream.ptr))
            self.runtime.call("cudaStreamDestroy", ctypes.c_void_p(stream.ptr))

    def test_the_stream_is_registered_only_for_the_capture(self):
        # After the capture an allocation on the stream is an ordinary one, and the stream may
        # capture again, into a pool of its own.
        s = self.cupy.cuda.ExternalStream(self.runtime.stream())
        for _ in range(2):
            s.begin_capture()
            p = self.lib.arcpool_malloc_async(4096, 0, s.ptr)
            self.assertTrue(p, self.lib.arcpool_last_error())
            _check(self.lib.arcpool_free_async(p, 4096, 0, s.ptr), "arcpool_free_async")
            self.runtime.call("cudaGraphDestroy", ctypes.c_void_p(s.end_capture()))
        self.assertNotEqual(0, self.lib.arcpool_stream_unregister(
            arcpool._lib.default_allocator(0), s.ptr), "still registered after the capture")
        self.runtime.call("cudaStreamSynchronize", ctypes.c_void_p(s.ptr))
        self.runtime.call("cudaStreamDestroy", ctypes.c_void_p(s.ptr))


    def test_a_capture_ended_on_another_current_device_is_undone(self):
        # An ExternalStream's device_id is -1 by default: the current device, which the code in
        # the capture may change. The capture was looked up by (current device, stream) at its
        # end, and missed: left registered for ever, its graph pool bound.
        s = self.cupy.cuda.ExternalStream(self.runtime.stream(), device_id=-1)
        s.begin_capture()
        self.cupy.cuda.current_device.id = 1
        try:
            graph = s.end_capture()
        finally:
            self.cupy.cuda.current_device.id = 0
        self.runtime.call("cudaGraphDestroy", ctypes.c_void_p(graph))
        self.assertNotEqual(0, self.lib.arcpool_stream_unregister(
            arcpool._lib.default_allocator(0), s.ptr), "still registered after the capture")
        self.runtime.call("cudaStreamSynchronize", ctypes.c_void_p(s.ptr))
        self.runtime.call("cudaStreamDestroy", ctypes.c_void_p(s.ptr))

    def test_a_capture_ended_through_another_object_of_its_stream_is_undone(self):
        # CuPy lets several objects share one stream ("the ptr may be shared between multiple
        # Stream instances", _BaseStream.__eq__; Stream.from_external makes a new one at every
        # call). A capture begun through one and ended through another is still unbound, its pool
        # released and its stream unregistered: keyed by the object, it was left registered for
        # ever (arcpool could then act on a stream the application destroyed).
        ptr = self.runtime.stream()
        before = _graph_pool_bytes()
        begun = self.cupy.cuda.ExternalStream(ptr)  # alive: the other object is another one
        begun.begin_capture()
        p = self.lib.arcpool_malloc_async(4096, 0, ptr)
        self.assertTrue(p, self.lib.arcpool_last_error())
        _check(self.lib.arcpool_free_async(p, 4096, 0, ptr), "arcpool_free_async")
        graph = self.cupy.cuda.ExternalStream(ptr).end_capture()
        del begun
        self.runtime.call("cudaGraphDestroy", ctypes.c_void_p(graph))
        self.assertNotEqual(0, self.lib.arcpool_stream_unregister(
            arcpool._lib.default_allocator(0), ptr), "still registered after the capture")
        deadline = time.time() + 10
        while _graph_pool_bytes() != before and time.time() < deadline:
            time.sleep(0.01)
        self.assertEqual(before, _graph_pool_bytes(), "the pool's memory went back")
        self.runtime.call("cudaStreamSynchronize", ctypes.c_void_p(ptr))
        self.runtime.call("cudaStreamDestroy", ctypes.c_void_p(ptr))

if __name__ == "__main__":
    unittest.main()
