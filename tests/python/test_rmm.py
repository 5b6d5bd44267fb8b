"""arcpool as an RMM memory resource from Python (arcpool.rmm, issue 12): RMM's DeviceBuffer
allocates and frees through arcpool's by-pointer functions, on the stream RMM passes.

RMM's Python package imports and runs its CallbackMemoryResource without a GPU, so on the host
driver this runs in CI (ARCPOOL_REQUIRE_RMM=1: it must not skip there); on a GPU the same
tests run on the CUDA driver, and the last one adds a stream of RMM's own.
"""
import importlib.util
import os
import unittest

import arcpool

HAVE_RMM = importlib.util.find_spec("rmm") is not None


def _in_use():
    return arcpool.stats()["arcpool.bytes_in_use_current"]


@unittest.skipUnless(HAVE_RMM or os.environ.get("ARCPOOL_REQUIRE_RMM") == "1",
                     "RMM's Python package is not installed (pip install '.[rmm]')")
class RmmResource(unittest.TestCase):
    def setUp(self):
        import rmm  # with ARCPOOL_REQUIRE_RMM=1 and no rmm, this fails the test

        import arcpool.rmm as ar
        self.rmm, self.mr = rmm, ar.memory_resource(0)

    def test_a_device_buffer_lives_in_arcpool(self):
        before = _in_use()
        buffer = self.rmm.DeviceBuffer(size=1 << 20, mr=self.mr)
        self.assertEqual(1 << 20, buffer.size)
        self.assertEqual(before + (1 << 20), _in_use())
        self.assertNotEqual(0, buffer.ptr)
        del buffer
        self.assertEqual(before, _in_use())

    def test_install_makes_it_rmms_resource_for_the_device(self):
        import arcpool.rmm as ar
        import rmm.mr

        previous = rmm.mr.get_per_device_resource(0)
        try:
            mr = ar.install(0)
            self.assertIs(mr, rmm.mr.get_per_device_resource(0))
            before = _in_use()
            # The device's resource (a DeviceBuffer with no mr asks the runtime for the current
            # device, which needs a GPU: below).
            buffer = self.rmm.DeviceBuffer(size=4096, mr=rmm.mr.get_per_device_resource(0))
            self.assertEqual(before + 4096, _in_use())
            del buffer
            self.assertEqual(before, _in_use())
            if arcpool.DRIVER == "cuda":
                buffer = self.rmm.DeviceBuffer(size=4096)  # the current device's: arcpool's
                self.assertEqual(before + 4096, _in_use())
                del buffer
        finally:
            rmm.mr.set_per_device_resource(0, previous)

    def test_a_failed_allocation_is_a_memory_error_with_arcpools_reason(self):
        with self.assertRaises(MemoryError) as caught:
            self.rmm.DeviceBuffer(size=1 << 62, mr=self.mr)
        self.assertIn("arcpool:", str(caught.exception))

    def test_a_failure_other_than_out_of_memory_is_no_memory_error(self):
        # RMM turns a MemoryError into rmm::out_of_memory, on which its failure-callback
        # adaptors (cuDF's spilling) free memory and retry: a bad device is not that. (Not a bad
        # stream handle: real CUDA dereferences one, and the process crashed on an H200.)
        import arcpool.rmm as ar

        with self.assertRaises(RuntimeError) as caught:
            ar.memory_resource(device=-1).allocate(4096)
        self.assertNotIsInstance(caught.exception, MemoryError)
        self.assertIn("ARCPOOL_STATUS_INVALID_ARGUMENT", str(caught.exception))

    def test_zero_bytes_are_a_null_pointer_as_rmms_own_resources_give(self):
        before = arcpool.stats()["arcpool.allocations"]
        self.assertEqual(0, self.mr.allocate(0))
        self.mr.deallocate(0, 0)
        self.assertEqual(before, arcpool.stats()["arcpool.allocations"])

    def test_a_failed_free_is_reported_on_stderr_not_raised(self):
        # RMM calls deallocate from C++ destructors: an exception has nowhere to go there.
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.mr.deallocate(0x1234, 16)
        self.assertIn("arcpool.rmm: free of 0x1234 (16 bytes) failed", err.getvalue())
        self.assertIn("0x1234", err.getvalue().split("failed:")[1], "arcpool's reason")

    @unittest.skipUnless(arcpool.DRIVER == "cuda", "an RMM stream needs a GPU")
    def test_a_buffer_on_an_rmm_stream(self):
        from rmm.pylibrmm.stream import Stream

        stream = Stream()
        before = _in_use()
        buffer = self.rmm.DeviceBuffer(size=1 << 20, stream=stream, mr=self.mr)
        self.assertEqual(before + (1 << 20), _in_use())
        del buffer
        stream.synchronize()
        self.assertEqual(before, _in_use())


if __name__ == "__main__":
    unittest.main()
