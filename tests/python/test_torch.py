"""arcpool as PyTorch's allocator (GPU machine: PyTorch installed there). Each scenario runs in
a fresh process: the allocator must be installed before the first CUDA tensor."""
import os
import subprocess
import sys
import textwrap
import unittest


def _torch_gpu():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


def _run(body):
    code = "import arcpool.torch, torch\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300)


@unittest.skipUnless(_torch_gpu() or os.environ.get("ARCPOOL_REQUIRE_GPU") == "1",
                     "PyTorch with a GPU is not available here")
class TorchDropIn(unittest.TestCase):
    def check(self, body):
        result = _run(body)
        self.assertEqual(0, result.returncode, result.stdout + result.stderr)
        return result.stdout

    def test_tensors_on_two_streams_with_record_stream(self):
        self.check("""
            arcpool.torch.install()
            side = torch.cuda.Stream()
            x = torch.full((1 << 24,), 3.0, device="cuda")
            side.wait_stream(torch.cuda.current_stream())  # the side stream sees x filled
            with torch.cuda.stream(side):
                torch.cuda._sleep(200_000_000)            # the side stream is busy...
                y = x * 2                                 # ...and then reads x
            x.record_stream(side)
            del x  # freed on the default stream, which is idle, long before the side stream read it
            z = torch.full((1 << 24,), 7.0, device="cuda")  # same size: must not get x's memory
            torch.cuda.synchronize()
            assert bool((y == 6.0).all()), "the side stream read memory that was reused early"
            assert bool((z == 7.0).all())
            s = arcpool.torch.stats()
            assert s["arcpool.use_records"] >= 1, s
            print("ok")
        """)

    def test_torch_cuda_memory_functions_answer_from_arcpool_once_patched(self):
        self.check("""
            arcpool.torch.install()
            arcpool.torch.patch_memory_api()
            before = torch.cuda.memory_allocated()
            x = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
            during = torch.cuda.memory_allocated()
            assert during == before + (1 << 22), (before, during)
            assert torch.cuda.max_memory_allocated() >= during
            assert torch.cuda.memory_stats()["allocation.all.current"] >= 1
            del x
            torch.cuda.synchronize()
            assert torch.cuda.memory_allocated() == before
            torch.cuda.reset_peak_memory_stats()
            assert torch.cuda.max_memory_allocated() == before
            arcpool.torch.unpatch_memory_api()
            print("ok")
        """)

    def test_sharing_a_tensor_with_another_process_fails_with_pytorchs_message(self):
        # design.md §14: PyTorch's pluggable allocator has no IPC; arcpool's own API shares
        # memory between processes. The user gets PyTorch's error, naming the missing piece.
        self.check("""
            import torch.multiprocessing.reductions as reductions
            arcpool.torch.install()
            x = torch.ones(4, device="cuda")
            try:
                reductions.reduce_tensor(x)
            except RuntimeError as e:
                message = str(e)
            else:
                raise AssertionError("a pluggable allocator's tensor was shared between processes")
            assert "does not yet support shareipchandle" in message.lower(), message
            print("ok")
        """)

    def test_record_stream_ignores_empty_and_foreign_tensors(self):
        self.check("""
            arcpool.torch.install()
            side = torch.cuda.Stream()
            torch.empty(0, device="cuda").record_stream(side)  # null storage
            shared = torch.from_dlpack(torch.ones(4, device="cuda"))
            shared.record_stream(side)  # arcpool's memory seen through DLPack: recorded
            try:
                import cupy  # CuPy's own pool: memory arcpool did not allocate
            except ImportError:
                cupy = None
            if cupy is not None:
                torch.from_dlpack(cupy.ones(4, dtype=cupy.float32)).record_stream(side)
            assert arcpool.torch.stats()["arcpool.use_records"] == 1
            print("ok")
        """)

    def test_a_small_training_loop(self):
        out = self.check("""
            arcpool.torch.install()
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                        torch.nn.Linear(512, 10)).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            data = torch.randn(512, 256, device="cuda")
            target = torch.randint(0, 10, (512,), device="cuda")
            first = None
            for step in range(50):
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(data), target)
                loss.backward()
                opt.step()
                first = first if first is not None else float(loss)
            assert float(loss) < first, (first, float(loss))
            s = arcpool.torch.stats()
            assert s["allocation.all.allocated"] > 0 and s["allocated_bytes.all.peak"] > 0, s
            torch.cuda.empty_cache()
            print("ok", s["allocated_bytes.all.peak"], s["reserved_bytes.all.peak"])
        """)
        self.assertIn("ok", out)

    def test_the_summary_and_torch_accelerator_answer_from_arcpool_once_patched(self):
        self.check("""
            arcpool.torch.install()
            arcpool.torch.patch_memory_api()
            x = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
            summary = torch.cuda.memory_summary()
            assert "arcpool memory summary" in summary, summary
            if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_allocated"):
                assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated()
            del x
            arcpool.torch.unpatch_memory_api()
            print("ok")
        """)

    def test_storages_made_outside_tensor_factories_come_from_arcpool(self):
        # PyTorch also allocates through its allocator registry (c10::GetAllocator(kCUDA)),
        # which a pluggable allocator's swap may not update: such memory would be the native
        # allocator's, outside arcpool's statistics.
        self.check("""
            arcpool.torch.install()
            before = arcpool.torch.memory_allocated()
            storage = torch.UntypedStorage(1 << 20, device="cuda")
            pinned_copy = torch.empty(1 << 20, dtype=torch.uint8).pin_memory().cuda()
            after = arcpool.torch.memory_allocated()
            assert after >= before + (2 << 20), (before, after)
            del storage, pinned_copy
            print("ok")
        """)

    def test_memory_fraction_zero_allows_no_new_memory(self):
        self.check("""
            arcpool.torch.install()
            torch.empty(16, device="cuda")  # the allocator exists
            torch.cuda.set_per_process_memory_fraction(0.0)
            try:
                torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
                raise SystemExit("allocated with a memory fraction of 0")
            except RuntimeError as e:
                assert "OUT_OF_MEMORY" in str(e), str(e)
            print("ok")
        """)

    def test_memory_fraction_is_a_hard_limit(self):
        self.check("""
            arcpool.torch.install()
            torch.cuda.set_per_process_memory_fraction(0.01)
            try:
                torch.empty(int(torch.cuda.get_device_properties(0).total_memory * 0.02),
                            dtype=torch.uint8, device="cuda")
                raise SystemExit("allocated beyond the memory fraction")
            except RuntimeError as e:
                assert "OUT_OF_MEMORY" in str(e), str(e)
            print("ok")
        """)

    def test_torch_cuda_graph_allocates_from_an_arcpool_graph_pool(self):
        # torch.cuda.graph through the shim's pool hooks: the captured step's tensors are blocks
        # of an arcpool graph pool, replays compute on new inputs, a second graph shares the
        # first one's pool, and the pool's memory goes back once both graphs are reset.
        self.check("""
            arcpool.torch.install()
            x = torch.ones(1 << 20, device="cuda")
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm-up on a side stream, as PyTorch's docs ask
                y = x * 2 + 1
            torch.cuda.current_stream().wait_stream(s)
            g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(g1):
                y = x * 2 + 1
            with torch.cuda.graph(g2, pool=g1.pool()):
                z = y + x
            held = arcpool.torch.stats()["arcpool.graph_pool_bytes_current"]
            assert held >= 2 * x.numel() * 4, held
            for value in (3.0, 5.0):
                x.fill_(value)
                g1.replay()
                g2.replay()
                torch.cuda.synchronize()
                assert bool((y == 2 * value + 1).all()) and bool((z == 3 * value + 1).all())
            del y, z
            g1.reset()
            g2.reset()
            torch.cuda.synchronize()
            import time
            deadline = time.time() + 10
            while arcpool.torch.stats()["arcpool.graph_pool_bytes_current"] and time.time() < deadline:
                time.sleep(0.01)
            assert arcpool.torch.stats()["arcpool.graph_pool_bytes_current"] == 0
            print("ok")
        """)

    def test_a_side_stream_forked_inside_a_capture_allocates_from_the_graph_pool(self):
        # Only the capture stream is registered for the capture; a side stream the capture forks
        # to allocates from the same arcpool graph pool (docs/graphs.md, "Streams a capture
        # forks to"), and the graph replays with it.
        self.check("""
            arcpool.torch.install()
            x = torch.ones(1 << 20, device="cuda")
            torch.cuda.synchronize()
            before = arcpool.torch.stats()["arcpool.graph_pool_bytes_current"]
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            with torch.cuda.graph(g):
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    y = x * 2
                torch.cuda.current_stream().wait_stream(side)
                z = y + 1
            held = arcpool.torch.stats()["arcpool.graph_pool_bytes_current"] - before
            assert held >= 2 * x.numel() * 4, held
            for value in (3.0, 5.0):
                x.fill_(value)
                g.replay()
                torch.cuda.synchronize()
                assert bool((z == 2 * value + 1).all())
            print("ok")
        """)

    def test_install_after_the_first_cuda_tensor_is_refused(self):
        self.check("""
            x = torch.ones(1, device="cuda")
            try:
                arcpool.torch.install()
                raise SystemExit("installed after CUDA initialization")
            except RuntimeError as e:
                assert "before the first CUDA tensor" in str(e), str(e)
            print("ok")
        """)


def _torch_importable():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(_torch_importable(), "PyTorch is not installed here")
class TorchHooksWithoutAGpu(unittest.TestCase):
    def test_install_sets_every_hook_through_a_setter_torch_has(self):
        # install() skips a setter this PyTorch lacks (all but record_stream and the graph-pool
        # ones, whose absence it refuses): the pinned torch (pyproject.toml) must have every one,
        # each gets the shim's function, and CUDAGraph's capture is wrapped. Needs no GPU.
        result = _run("""
            import ctypes
            setters = {"set_record_stream_fn": "arcpool_torch_record_stream",
                       "set_reset_fn": "arcpool_torch_empty_cache",
                       "set_memory_fraction_fn": "arcpool_torch_set_memory_fraction",
                       "set_begin_allocate_to_pool": "arcpool_torch_begin_allocate_to_pool",
                       "set_end_allocate_to_pool_fn": "arcpool_torch_end_allocate_to_pool",
                       "set_release_pool": "arcpool_torch_release_pool"}
            native = torch._C._CUDAPluggableAllocator
            missing = [name for name in setters if not hasattr(native, name)]
            assert not missing, f"torch {torch.__version__} lacks {missing}"
            called = {}
            for name in setters:
                def record(self, pointer, _name=name, _set=getattr(native, name)):
                    called[_name] = pointer
                    return _set(self, pointer)
                setattr(native, name, record)
            allocator, shim = arcpool.torch.install()
            for name, function in setters.items():
                expected = ctypes.cast(getattr(shim, function), ctypes.c_void_p).value
                assert called.get(name) == expected, (name, called.get(name), expected)
            assert getattr(torch.cuda.CUDAGraph.capture_begin, "_arcpool_wrapped", False)
            print("ok", torch.__version__, sorted(called))
        """)
        self.assertEqual(0, result.returncode, result.stdout + result.stderr)
        self.assertIn("ok", result.stdout)


if __name__ == "__main__":
    unittest.main()
