"""The Python package without a GPU: import, driver report, statistics, by-pointer calls."""
import ctypes
import os
import subprocess
import sys
import unittest

import arcpool


class ArcpoolPackage(unittest.TestCase):
    def test_import_reports_the_driver_it_would_use(self):
        self.assertIn(arcpool.DRIVER, ("cuda", "host"))
        self.assertEqual(100, arcpool.VERSION)

    def test_importing_asks_no_driver_until_driver_is_read(self):
        # The driver query initializes CUDA, and a child forked after that cannot use CUDA
        # (DataLoader workers): import arcpool and its framework modules without it.
        code = ("import arcpool, arcpool.torch, arcpool.cupy, arcpool.rmm\n"
                "from arcpool import *\n"  # a star import reads every name of __all__
                "print('DRIVER' in vars(arcpool))\n"
                "print(arcpool.DRIVER)\n"
                "print('DRIVER' in vars(arcpool))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True)
        before, driver, after = out.stdout.split()
        self.assertEqual(("False", "True"), (before, after))
        self.assertIn(driver, ("cuda", "host"))
        with self.assertRaises(AttributeError):
            arcpool.NO_SUCH_NAME

    def test_the_environment_overrides_the_driver(self):
        out = subprocess.run(
            [sys.executable, "-c", "import arcpool; print(arcpool.DRIVER)"],
            env=dict(os.environ, ARCPOOL_DRIVER="host"), capture_output=True, text=True,
            check=True)
        self.assertEqual("host", out.stdout.strip())

    def test_an_environment_driver_naming_no_driver_is_an_error(self):
        code = ("import arcpool\n"
                "try:\n"
                "    arcpool.driver()\n"
                "except arcpool.ArcpoolError as e:\n"
                "    print(e.status, e)\n")
        out = subprocess.run([sys.executable, "-c", code],
                             env=dict(os.environ, ARCPOOL_DRIVER="tpu"), capture_output=True,
                             text=True, check=True)
        self.assertIn("ARCPOOL_STATUS_INVALID_ARGUMENT", out.stdout)
        self.assertIn("ARCPOOL_DRIVER=tpu", out.stdout)

    def test_by_pointer_allocations_count_in_the_stats(self):
        lib = arcpool._lib.lib
        device = 0
        before = arcpool.stats(device)
        pointer = lib.arcpool_malloc_async(1 << 16, device, None)
        self.assertTrue(pointer, lib.arcpool_last_error())
        during = arcpool.stats(device)
        self.assertEqual(before["allocated_bytes.all.current"] + (1 << 16),
                         during["allocated_bytes.all.current"])
        self.assertEqual(before["arcpool.allocations"] + 1, during["arcpool.allocations"])
        self.assertEqual(0, lib.arcpool_record_stream(pointer, None))
        self.assertEqual(0, lib.arcpool_free_async(pointer, 1 << 16, device, None))
        after = arcpool.stats(device)
        self.assertEqual(before["allocated_bytes.all.current"],
                         after["allocated_bytes.all.current"])

    def test_failures_name_the_status(self):
        lib = arcpool._lib.lib
        status = lib.arcpool_free_async(ctypes.c_void_p(0x1234), 16, 0, None)
        with self.assertRaises(arcpool.ArcpoolError) as caught:
            arcpool._lib.check(status, "arcpool_free_async")
        self.assertEqual("ARCPOOL_STATUS_UNKNOWN_POINTER", caught.exception.status)
        self.assertIn("0x1234", str(caught.exception))

    def test_stream_stats_count_an_allocation_on_its_stream_row(self):
        lib = arcpool._lib.lib
        def legacy_row():  # the legacy default stream's own row: stream 0, not "other"
            rows = arcpool.stream_stats()
            self.assertEqual(1, rows[-1]["other"], "the other-streams row comes last")
            found = [r for r in rows if r["stream"] == 0 and r["other"] == 0]
            return found[0] if found else {"allocations": 0, "bytes_in_use_current": 0}

        before = legacy_row()["allocations"]
        pointer = lib.arcpool_malloc_async(1 << 16, 0, None)  # the legacy default stream
        self.assertTrue(pointer, lib.arcpool_last_error())
        after = legacy_row()
        self.assertEqual(before + 1, after["allocations"])
        self.assertGreaterEqual(after["bytes_in_use_current"], 1 << 16)
        self.assertEqual(0, lib.arcpool_free_async(pointer, 1 << 16, 0, None))
        self.assertNotIn("arcpool.streams", arcpool.stats(), "stats() holds numbers only")

    def test_stats_survive_a_json_that_grew_after_it_was_sized(self):
        # Between the sizing call and the copy, other threads' allocations and the reclaim
        # worker change the figures: a number that gains a digit, or a new stream's row, makes
        # the JSON longer than sized. Here the sizing call reports no length at all.
        lib = arcpool._lib.lib
        real = lib.arcpool_stats_json
        def sized_short(handle, buffer, capacity, out_length):
            status = real(handle, buffer, capacity, out_length)
            if not buffer and out_length:
                out_length._obj.value = 0
            return status
        lib.arcpool_stats_json = sized_short
        try:
            s = arcpool.stats()
        finally:
            lib.arcpool_stats_json = real
        self.assertIn("allocated_bytes.all.current", s)

    def test_queries_of_a_device_never_used_create_no_allocator(self):
        # Logging loops ask every device (torch.cuda.memory_allocated(i) once patched): an
        # allocator created for the query would create a CUDA context on that GPU, in every
        # process that asks. A fresh process, so that device 1 is surely unused.
        code = ("import ctypes, arcpool\n"
                "s = arcpool.stats(1)\n"
                "assert s['allocated_bytes.all.current'] == 0, s\n"
                "assert s['arcpool.allocations'] == 0, s\n"
                "assert arcpool.stream_stats(1)[-1]['other'] == 1\n"
                "arcpool.reset_peak_stats(1)\n"
                "arcpool.empty_cache(1)\n"
                "print(arcpool._lib.existing_allocator(1) is None)\n"
                "try:\n"
                "    runtime = ctypes.CDLL('libcudart.so.13')\n"
                "    runtime.simcuda_primary_contexts.restype = ctypes.c_uint64\n"
                "    print(runtime.simcuda_primary_contexts(1))\n"
                "except (OSError, AttributeError):\n"
                "    print(0)  # no simcuda: no context counter to read\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(0, out.returncode, out.stderr)
        none, contexts = out.stdout.split()
        self.assertEqual("True", none, "a query created device 1's allocator")
        self.assertEqual("0", contexts, "a query created a CUDA context on device 1")

    def test_torch_style_keys_mirror_arcpool_figures(self):
        s = arcpool.stats()
        for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                    "reserved_bytes.all.current", "reserved_bytes.all.peak",
                    "num_alloc_retries", "num_ooms"):
            self.assertIn(key, s)
        self.assertEqual(s["allocated_bytes.all.current"], s["arcpool.bytes_in_use_current"])
        arcpool.reset_peak_stats()
        arcpool.empty_cache()


if __name__ == "__main__":
    unittest.main()
