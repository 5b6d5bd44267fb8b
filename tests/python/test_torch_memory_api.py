"""arcpool.torch's torch.cuda memory functions and the patch that puts them in torch.cuda.

They read arcpool's statistics, so they run without a GPU and without PyTorch; the patch is
checked on a stand-in for torch.cuda here, and on torch itself where torch is installed.
"""
import ctypes
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest

import arcpool
import arcpool.torch as at

MIB = 1 << 20


def _malloc(size, device=0):
    pointer = arcpool._lib.lib.arcpool_malloc_async(size, device, None)
    if not pointer:
        raise AssertionError(arcpool._lib.lib.arcpool_last_error().decode())
    return pointer


def _free(pointer, size, device=0):
    arcpool._lib.check(arcpool._lib.lib.arcpool_free_async(ctypes.c_void_p(pointer), size,
                                                          device, None), "arcpool_free_async")


class TorchMemoryApi(unittest.TestCase):
    def test_the_memory_functions_answer_from_arcpool(self):
        before = at.memory_allocated(0)
        pointer = _malloc(4 * MIB)  # above the per-thread batch: the peak sees it
        self.assertEqual(before + 4 * MIB, at.memory_allocated(0))
        self.assertGreaterEqual(at.max_memory_allocated(0), before + 4 * MIB)
        self.assertGreaterEqual(at.memory_reserved(0), 4 * MIB)
        self.assertGreaterEqual(at.max_memory_reserved(0), at.memory_reserved(0))
        stats = at.memory_stats(0)
        self.assertEqual(sorted(stats), list(stats), "sorted by key, as torch's")
        self.assertEqual(stats["allocated_bytes.all.current"], stats["arcpool.bytes_in_use_current"])
        self.assertEqual(stats["allocation.all.current"], stats["arcpool.allocations_in_use_current"])
        _free(pointer, 4 * MIB)
        self.assertEqual(before, at.memory_allocated(0))
        at.reset_peak_memory_stats(0)
        self.assertEqual(at.memory_allocated(0), at.max_memory_allocated(0))

    def test_the_summary_is_a_table_of_arcpools_figures(self):
        # torch.cuda.memory_summary reads the native allocator's keys (large_pool, ...): with
        # any other allocator's statistics it raises KeyError, so arcpool has its own.
        pointer = _malloc(3 * MIB)
        try:
            summary = at.memory_summary(0)
            lines = summary.splitlines()
            self.assertEqual(1, len({len(line) for line in lines}), summary)
            self.assertIn("device ID 0", lines[1])
            allocated = next(line for line in lines if line.startswith("| Allocated memory"))
            self.assertEqual(at._format_size(at.memory_allocated(0)),
                             allocated.split("|")[2].strip())
            self.assertIn("| Cache hits", summary)
        finally:
            _free(pointer, 3 * MIB)
        self.assertEqual("1023 B", at._format_size(1023))
        self.assertEqual("3 MiB", at._format_size(3 * MIB + 5))
        self.assertEqual("2048 GiB", at._format_size(2 << 40))

    def test_devices_are_named_as_torch_names_them(self):
        self.assertEqual(at.memory_allocated(0), at.memory_allocated("cuda:0"))
        self.assertEqual(0, at._device_index(types.SimpleNamespace(type="cuda", index=0)))
        try:
            import torch

            count = torch.cuda.device_count()
        except ImportError:
            count = 0
        if 0 < count <= 3:  # a device this process does not have, as torch says it
            with self.assertRaisesRegex(RuntimeError, "Invalid device argument 3"):
                at._device_index("cuda:3")
        else:  # no device to check against (no GPU, or no torch), or a fourth device
            self.assertEqual(3, at._device_index("cuda:3"))
        # A torch.cuda.device (the context manager, torch.cuda.device_of's too) has idx, as
        # torch.cuda's _get_device_index reads it.
        self.assertEqual(1, at._device_argument(types.SimpleNamespace(idx=1)))
        with self.assertRaises(ValueError):
            at.memory_allocated("cpu")
        with self.assertRaises(ValueError):
            at._device_index(types.SimpleNamespace(type="cpu", index=None))

    def test_the_patch_replaces_torch_cuda_functions_and_unpatch_restores_them(self):
        def native(name):
            def refuse(device=None):
                raise RuntimeError(f"{name}: a pluggable allocator has no such statistics")
            return refuse

        names = at._MEMORY_API
        memory_names = names + at._SNAPSHOT_API
        memory = types.SimpleNamespace(**{name: native(name) for name in memory_names})
        cuda = types.SimpleNamespace(memory=memory, **{name: getattr(memory, name) for name in names})
        originals = {name: getattr(memory, name) for name in memory_names}
        at.patch_memory_api(cuda)
        at.patch_memory_api(cuda)  # twice: still restorable to torch's own
        try:
            for namespace, patched in ((cuda, names), (cuda.memory, memory_names)):
                for name in patched:
                    self.assertIs(getattr(at, name), getattr(namespace, name), name)
            pointer = _malloc(2 * MIB)
            self.assertEqual(at.memory_allocated(0), cuda.memory_allocated(0))
            self.assertEqual(at.memory_stats(0)["allocated_bytes.all.current"],
                             cuda.memory.memory_stats(0)["allocated_bytes.all.current"])
            _free(pointer, 2 * MIB)
        finally:
            at.unpatch_memory_api()
        for namespace, patched in ((cuda, names), (cuda.memory, memory_names)):
            for name in patched:
                self.assertIs(originals[name], getattr(namespace, name), name)

    def test_the_patch_covers_torch_accelerator_where_it_has_the_functions(self):
        def native(device=None):
            raise RuntimeError("a pluggable allocator has no device statistics")

        cuda_names = at._MEMORY_API + at._SNAPSHOT_API
        memory = types.SimpleNamespace(**{name: native for name in cuda_names})
        cuda = types.SimpleNamespace(memory=memory, **{name: native for name in at._MEMORY_API})
        # An accelerator module with only some of the functions (an older torch).
        accelerator_memory = types.SimpleNamespace(memory_stats=native, memory_allocated=native,
                                                   reset_accumulated_memory_stats=native)
        accelerator = types.SimpleNamespace(memory=accelerator_memory,
                                            memory_allocated=native)
        at.patch_memory_api(cuda, accelerator)
        try:
            self.assertIs(at.memory_allocated, accelerator.memory_allocated)
            self.assertIs(at.memory_stats, accelerator_memory.memory_stats)
            self.assertIs(at.memory_allocated, accelerator_memory.memory_allocated)
            self.assertIs(at.reset_accumulated_memory_stats,
                          accelerator_memory.reset_accumulated_memory_stats)
            self.assertFalse(hasattr(accelerator, "memory_stats"), "nothing added")
            self.assertEqual(at.memory_allocated(0), accelerator.memory_allocated(0))
        finally:
            at.unpatch_memory_api()
        self.assertIs(native, accelerator.memory_allocated)
        self.assertIs(native, accelerator_memory.memory_stats)

    def test_accumulated_counts_restart_and_the_memory_fraction_reads_back(self):
        # torch's own raise with a pluggable allocator ("does not yet support
        # resetAccumulatedStats" / "getMemoryFraction"); the patch covers them where torch has
        # them.
        def native(device=None):
            raise RuntimeError("CUDAPluggableAllocator does not yet support it")

        names = at._MEMORY_API + at._LATER_API
        memory = types.SimpleNamespace(**{name: native for name in names + at._SNAPSHOT_API})
        cuda = types.SimpleNamespace(memory=memory, **{name: native for name in names})
        at.patch_memory_api(cuda)
        try:
            _free(_malloc(MIB), MIB)
            self.assertGreater(cuda.memory_stats(0)["allocation.all.allocated"], 0)
            arcpool_allocations = cuda.memory_stats(0)["arcpool.allocations"]
            cuda.reset_accumulated_memory_stats(0)
            stats = cuda.memory.memory_stats(0)
            self.assertEqual(0, stats["allocation.all.allocated"])
            self.assertEqual(0, stats["allocation.all.freed"])
            self.assertEqual(0, stats["num_ooms"])
            self.assertEqual(arcpool_allocations, stats["arcpool.allocations"], "keeps counting")
            _free(_malloc(MIB), MIB)
            self.assertEqual(1, cuda.memory_stats(0)["allocation.all.allocated"])
            self.assertEqual(1, cuda.memory_stats(0)["allocation.all.freed"])
            self.assertEqual(1.0, cuda.get_per_process_memory_fraction(0))
            shim = ctypes.CDLL(at._shim_path())
            shim.arcpool_torch_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
            shim.arcpool_torch_set_memory_fraction(0.5, 0)  # what torch's setter calls
            try:
                self.assertEqual(0.5, cuda.memory.get_per_process_memory_fraction(0))
            finally:
                shim.arcpool_torch_set_memory_fraction(1.0, 0)
        finally:
            at.unpatch_memory_api()
            at._accumulated_base.clear()
        self.assertIs(native, cuda.reset_accumulated_memory_stats)

    def test_a_replaced_default_allocator_counts_from_zero_again(self):
        _free(_malloc(MIB), MIB)
        at.reset_accumulated_memory_stats(0)
        _free(_malloc(MIB), MIB)
        self.assertEqual(1, at.memory_stats(0)["allocation.all.allocated"])
        lib = arcpool._lib.lib
        lib.arcpool_default_allocator_set.argtypes = [ctypes.c_int, ctypes.c_void_p]
        try:
            self.assertEqual(0, lib.arcpool_default_allocator_set(0, None))  # a fresh one next
            self.assertEqual(0, at.memory_stats(0)["allocation.all.allocated"])
            _free(_malloc(MIB), MIB)
            self.assertEqual(1, at.memory_stats(0)["allocation.all.allocated"])
        finally:
            at._accumulated_base.clear()

    def test_a_stale_base_is_dropped_once_and_never_a_newer_one(self):
        # Threads reading one stale base (its allocator replaced) may both drop it, and another
        # may reset a newer base meanwhile. The patched _allocator_value plays that other thread
        # at the moment memory_stats checks the base.
        _free(_malloc(MIB), MIB)
        real = at._allocator_value

        def make_stale():
            at.reset_accumulated_memory_stats(0)
            at._accumulated_base[0] = (object(), at._accumulated_base[0][1])

        def another_thread_drops(index):
            at._accumulated_base.pop(index, None)
            return real(index)

        def another_thread_resets(index):
            at._allocator_value = real
            at.reset_accumulated_memory_stats(index)
            return real(index)

        try:
            make_stale()
            at._allocator_value = another_thread_drops
            at.memory_stats(0)  # no KeyError
            self.assertNotIn(0, at._accumulated_base)
            make_stale()
            at._allocator_value = another_thread_resets
            at.memory_stats(0)
            self.assertEqual(real(0), at._accumulated_base[0][0], "the newer base stays")
            self.assertEqual(0, at.memory_stats(0)["allocation.all.allocated"])
        finally:
            at._allocator_value = real
            at._accumulated_base.clear()

    def test_a_device_this_process_does_not_have_raises_as_torchs_own(self):
        # With torch, torch.cuda.memory_allocated(7) on a two-GPU machine raises "Invalid
        # device argument"; arcpool would read zeros (no allocator there). A stand-in torch.
        fake = types.ModuleType("torch")
        fake.cuda = types.SimpleNamespace(device_count=lambda: 2)
        saved = sys.modules.get("torch")
        sys.modules["torch"] = fake
        try:
            self.assertEqual(at.memory_allocated(0), arcpool.stats(0)["allocated_bytes.all.current"])
            with self.assertRaises(RuntimeError) as caught:
                at.memory_allocated(7)
            self.assertIn("Invalid device argument 7", str(caught.exception))
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved

    def test_no_device_argument_does_not_start_torchs_cuda(self):
        # torch.cuda.current_device() starts CUDA (_lazy_init): install() is then refused. Once
        # torch started it, its current device is the default. A stand-in torch.
        def start_cuda():
            raise AssertionError("torch.cuda.current_device() started CUDA")

        fake = types.ModuleType("torch")
        fake.cuda = types.SimpleNamespace(device_count=lambda: 2, is_available=lambda: True,
                                          is_initialized=lambda: False, current_device=start_cuda)
        saved = sys.modules.get("torch")
        sys.modules["torch"] = fake
        try:
            self.assertEqual(at.memory_allocated(0), at.memory_allocated())
            self.assertEqual(at.memory_stats(0), at.memory_stats())
            fake.cuda.is_initialized = lambda: True
            fake.cuda.current_device = lambda: 1
            self.assertEqual(1, at._device_index(None))
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved

    def test_the_shim_is_never_a_stray_file_of_the_working_directory(self):
        # The last candidate is a bare name, which dlopen (torch's) looks for on the system's
        # search path, never in the working directory. In a fresh process: one that loaded the
        # shim already would find it by its soname.
        code = textwrap.dedent("""
            import os, sys
            import arcpool.torch as at
            os.chdir(sys.argv[1])
            with open("libarcpool_torch.so", "w") as f:
                f.write("not a library")
            at._lib._candidates = lambda name: iter([os.path.join("/nonexistent", name), name])
            try:
                print(at._shim_path())
            except ImportError:
                print("not found")
            """)
        # The child's search path must not hold the real shim (tools/device-check puts the
        # package's lib folder on LD_LIBRARY_PATH): else a bare name is rightly found there.
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "libarcpool_torch.so")))
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run([sys.executable, "-c", code, tmp], capture_output=True,
                                 text=True, check=True, env=env)
        self.assertEqual("not found", out.stdout.strip(), out.stderr)

    @unittest.skipUnless(importlib.util.find_spec("torch"), "PyTorch is not installed here")
    def test_the_patch_on_torch_itself(self):
        import torch

        original = torch.cuda.memory_allocated
        at.patch_memory_api()
        try:
            self.assertIs(at.memory_allocated, torch.cuda.memory_allocated)
            self.assertIs(at.memory_stats, torch.cuda.memory.memory_stats)
            self.assertIs(at._snapshot, torch.cuda.memory._snapshot)
            if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_allocated"):
                self.assertIs(at.memory_allocated, torch.accelerator.memory_allocated)
            self.assertEqual(at.memory_allocated(0), torch.cuda.memory_allocated(0))
        finally:
            at.unpatch_memory_api()
        self.assertIs(original, torch.cuda.memory_allocated)


if __name__ == "__main__":
    unittest.main()
