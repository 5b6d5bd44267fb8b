"""arcpool.torch's wrapper of torch.cuda.CUDAGraph's capture (docs/graphs.md, "PyTorch's graph
pools"): the capture stream is registered with arcpool from just before the capture begins until
just after it ends. Checked on stand-ins for torch and the shim, so it runs without a GPU and
without PyTorch; tests/python/test_torch.py runs torch.cuda.graph itself on a GPU.
"""
import types
import unittest

import arcpool
import arcpool.torch as at


class _StandIns:
    """A torch with a CUDAGraph class and a current stream, and a shim whose registration
    functions record their calls; `calls` interleaves both in order."""

    def __init__(self, stream=0x5000, begin_error=None, end_error=None, register_status=0,
                 end_refusals=0, begin_error_capturing=False):
        self.calls = []
        calls = self.calls
        capture = {"on": False, "refusals": end_refusals}

        class CUDAGraph:
            def capture_begin(self, pool=None, capture_error_mode="global"):
                calls.append(("capture_begin", pool, capture_error_mode))
                capture["on"] = begin_error_capturing  # the failure came after the capture began
                if begin_error is not None:
                    raise begin_error
                capture["on"] = True

            def capture_end(self):
                calls.append(("capture_end",))
                if capture["refusals"] > 0:  # PyTorch's check before it ends the capture
                    capture["refusals"] -= 1
                    raise RuntimeError("Capture must end on the same stream it began on.")
                capture["on"] = False
                if end_error is not None:
                    raise end_error

        current = types.SimpleNamespace(cuda_stream=stream)
        self.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            CUDAGraph=CUDAGraph, current_device=lambda: 0, current_stream=lambda device: current))

        def register(device, s):
            calls.append(("register", device, s))
            return register_status

        def unregister(device, s):  # arcpool refuses it while the stream captures
            calls.append(("unregister", device, s))
            return at._UNSUPPORTED if capture["on"] else 0

        self.shim = types.SimpleNamespace(arcpool_torch_capture_stream_begin=register,
                                          arcpool_torch_capture_stream_end=unregister)
        at._register_capture_streams(self.torch, self.shim)

    def graph(self):
        return self.torch.cuda.CUDAGraph()


class CaptureStreamRegistration(unittest.TestCase):
    def test_the_capture_stream_is_registered_for_the_capture_only(self):
        fake = _StandIns()
        g = fake.graph()
        g.capture_begin(pool=(0, 3), capture_error_mode="relaxed")
        g.capture_end()
        self.assertEqual([("register", 0, 0x5000), ("capture_begin", (0, 3), "relaxed"),
                          ("capture_end",), ("unregister", 0, 0x5000)], fake.calls)

    def test_a_capture_that_fails_to_begin_unregisters_and_raises_pytorchs_error(self):
        fake = _StandIns(begin_error=RuntimeError("CUDA graphs must be captured on a non-default "
                                                  "stream"))
        with self.assertRaisesRegex(RuntimeError, "non-default stream"):
            fake.graph().capture_begin()
        self.assertEqual([("register", 0, 0x5000), ("capture_begin", None, "global"),
                          ("unregister", 0, 0x5000)], fake.calls)

    def test_a_capture_that_fails_to_end_unregisters_and_raises_pytorchs_error(self):
        fake = _StandIns(end_error=RuntimeError("operation not permitted when stream is "
                                                "capturing"))
        g = fake.graph()
        g.capture_begin()
        with self.assertRaisesRegex(RuntimeError, "not permitted"):
            g.capture_end()
        self.assertEqual(("unregister", 0, 0x5000), fake.calls[-1])

    def test_a_capture_end_pytorch_refused_keeps_the_registration_for_the_next(self):
        fake = _StandIns(end_refusals=1)
        g = fake.graph()
        g.capture_begin()
        with self.assertRaisesRegex(RuntimeError, "same stream"):
            g.capture_end()  # the capture goes on: the withdrawal is refused
        self.assertEqual(("unregister", 0, 0x5000), fake.calls[-1])
        g.capture_end()
        self.assertEqual([("capture_end",), ("unregister", 0, 0x5000)], fake.calls[-2:])

    def test_a_capture_that_failed_after_it_began_keeps_the_registration_until_its_end(self):
        fake = _StandIns(begin_error=RuntimeError("failed after cudaStreamBeginCapture"),
                         begin_error_capturing=True)
        g = fake.graph()
        with self.assertRaisesRegex(RuntimeError, "after cudaStreamBeginCapture"):
            g.capture_begin()
        self.assertEqual(("unregister", 0, 0x5000), fake.calls[-1])  # refused: capturing
        g.capture_end()
        self.assertEqual([("capture_end",), ("unregister", 0, 0x5000)], fake.calls[-2:])

    def test_a_refused_registration_raises_arcpools_error_and_begins_no_capture(self):
        fake = _StandIns(register_status=3)
        with self.assertRaises(arcpool._lib.ArcpoolError):
            fake.graph().capture_begin()
        self.assertEqual([("register", 0, 0x5000)], fake.calls)

    def test_the_default_stream_is_left_to_pytorchs_own_refusal(self):
        fake = _StandIns(stream=0)
        g = fake.graph()
        g.capture_begin()
        g.capture_end()
        self.assertEqual([("capture_begin", None, "global"), ("capture_end",)], fake.calls)

    def test_wrapping_twice_registers_once(self):
        fake = _StandIns()
        at._register_capture_streams(fake.torch, fake.shim)
        g = fake.graph()
        g.capture_begin()
        g.capture_end()
        self.assertEqual(1, sum(1 for call in fake.calls if call[0] == "register"))


if __name__ == "__main__":
    unittest.main()
