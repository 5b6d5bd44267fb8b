"""arcpool as CuPy's allocator (GPU machine: CuPy installed there)."""
import os
import unittest


def _cupy_gpu():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@unittest.skipUnless(_cupy_gpu() or os.environ.get("ARCPOOL_REQUIRE_GPU") == "1",
                     "CuPy with a GPU is not available here")
class CupyDropIn(unittest.TestCase):
    def test_arrays_allocate_on_cupys_current_stream(self):
        import cupy

        import arcpool.cupy

        arcpool.cupy.install()
        before = arcpool.cupy.stats()["arcpool.allocations"]
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            a = cupy.arange(1 << 20, dtype=cupy.float64)  # float64: the sum is exact
            b = (a * 2).sum()
        stream.synchronize()
        self.assertEqual(float(b), float((1 << 20) * ((1 << 20) - 1)))
        self.assertGreater(arcpool.cupy.stats()["arcpool.allocations"], before)
        del a
        stream.synchronize()

    def test_zero_size_arrays(self):
        import cupy

        import arcpool.cupy

        arcpool.cupy.install()
        empty = cupy.empty(0, dtype=cupy.float32)
        self.assertEqual(0, empty.size)
        self.assertEqual(0.0, float(cupy.zeros(0).sum()))

    def launch_and_check(self, graph, stream, x, result):
        """Launches `graph` on `stream` with x filled with 3, then 5, and expects result == 2x + 1
        each time."""
        for value in (3.0, 5.0):
            x.fill(value)
            graph.launch(stream=stream)
            stream.synchronize()
            self.assertTrue(bool((result == 2 * value + 1).all()))

    def test_a_stream_capture_allocates_from_a_graph_pool_and_relaunches(self):
        # Stream.begin_capture through arcpool.cupy's wrapper: the arrays made in the capture
        # are blocks of a graph pool, so the graph keeps its output and launches again.
        import cupy

        import arcpool.cupy

        arcpool.cupy.install()
        before = arcpool.cupy.stats()["arcpool.graph_pool_bytes_current"]
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = cupy.ones(1 << 20, dtype=cupy.float32)
            stream.begin_capture()
            y = x * 2 + 1
            graph = stream.end_capture()
            self.assertGreaterEqual(arcpool.cupy.stats()["arcpool.graph_pool_bytes_current"],
                                    before + 4 * (1 << 20))
            self.launch_and_check(graph, stream, x, y)
        del y, graph
        stream.synchronize()

    def test_a_stream_the_capture_forks_to_allocates_from_its_graph_pool(self):
        # A side stream that waits on the capturing stream joins the capture; arcpool was never
        # told of it, and its arrays come from the capture's graph pool all the same.
        import cupy

        import arcpool.cupy

        arcpool.cupy.install()
        before = arcpool.cupy.stats()["arcpool.graph_pool_bytes_current"]
        stream = cupy.cuda.Stream(non_blocking=True)
        side = cupy.cuda.Stream(non_blocking=True)
        with stream:
            x = cupy.ones(1 << 20, dtype=cupy.float32)
            stream.begin_capture()
            side.wait_event(stream.record())  # fork
            with side:
                y = x * 2
            stream.wait_event(side.record())  # join
            z = y + 1
            graph = stream.end_capture()
            self.assertGreaterEqual(arcpool.cupy.stats()["arcpool.graph_pool_bytes_current"],
                                    before + 8 * (1 << 20))
            self.launch_and_check(graph, stream, x, z)
        del y, z, graph
        stream.synchronize()


if __name__ == "__main__":
    unittest.main()
