"""arcpool's memory snapshot in PyTorch's format (issue 12): arcpool.memory_snapshot() and
dump_snapshot() from the history that ARCPOOL_HISTORY turns on, checked with Python's pickle
and with PyTorch's own torch/cuda/_memory_viz.py (`stats` and `trace`) from the pinned torch
release, which tools/fetch-memory-viz fetches and ARCPOOL_MEMORY_VIZ names. Without it that
part skips, unless ARCPOOL_REQUIRE_MEMORY_VIZ=1 (CI). Runs on the host driver: no GPU needed.

Each case runs in a child process, so that the history is on from the default allocator's
creation, as a user sets it.
"""
import importlib.util
import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import unittest

# The child: a live block, a cached block and a block given back, then the snapshot and stats.
_WORKLOAD = textwrap.dedent("""
    import ctypes, json, sys
    import arcpool
    lib = arcpool._lib.lib

    def malloc(size):
        pointer = lib.arcpool_malloc_async(size, 0, None)
        if not pointer:
            raise SystemExit(lib.arcpool_last_error().decode())
        return pointer

    def free(pointer, size):
        arcpool._lib.check(lib.arcpool_free_async(ctypes.c_void_p(pointer), size, 0, None), "free")

    live, cached, returned = malloc(4 << 20), malloc(1000), malloc(3 << 20)
    free(cached, 1000)        # the stream's cache keeps it: an inactive block
    free(returned, 3 << 20)   # above the cache's largest block: back to the pool
    arcpool.dump_snapshot(sys.argv[1])
    print(json.dumps({"live": live, "cached": cached, "returned": returned,
                      "stats": arcpool.stats()}))
    free(live, 4 << 20)
""")


def _run_child(script, history, *args):
    env = dict(os.environ)
    env["ARCPOOL_DRIVER"] = "host"  # devices 1 and 2, which a GPU machine may not have
    env.pop("ARCPOOL_HISTORY", None)
    if history is not None:
        env["ARCPOOL_HISTORY"] = str(history)
    done = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=120)
    return done


def _memory_viz():
    path = os.environ.get("ARCPOOL_MEMORY_VIZ", "")
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("_memory_viz", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Snapshot(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.folder.name, "snapshot.pickle")
        done = _run_child(_WORKLOAD, 1000, cls.path)
        if done.returncode != 0:
            raise AssertionError(f"the workload failed:\n{done.stdout}\n{done.stderr}")
        cls.facts = json.loads(done.stdout.strip().splitlines()[-1])
        with open(cls.path, "rb") as f:
            cls.data = pickle.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.folder.cleanup()

    def state_at(self, pointer):
        for segment in self.data["segments"]:
            if segment["address"] == pointer:
                return segment["blocks"][0]["state"]
        return "absent"

    def test_segments_follow_the_blocks_and_add_up_to_the_stats(self):
        self.assertEqual("active_allocated", self.state_at(self.facts["live"]))
        self.assertEqual("inactive", self.state_at(self.facts["cached"]))
        self.assertEqual("absent", self.state_at(self.facts["returned"]))
        reserved = sum(s["total_size"] for s in self.data["segments"])
        allocated = sum(b["requested_size"] for s in self.data["segments"] for b in s["blocks"]
                        if b["state"] == "active_allocated")
        stats = self.facts["stats"]
        self.assertEqual(stats["arcpool.bytes_held_current"], reserved)
        self.assertEqual(stats["arcpool.bytes_in_use_current"], allocated)
        for segment in self.data["segments"]:
            self.assertEqual(segment["total_size"], sum(b["size"] for b in segment["blocks"]))

    def test_trace_entries_carry_what_memory_viz_reads(self):
        entries = self.data["device_traces"][0]
        self.assertEqual(["segment_alloc", "alloc"] * 3 + ["free_requested", "free_completed"] * 2
                         + ["segment_free"], [e["action"] for e in entries])
        for e in entries:
            self.assertEqual({"action", "addr", "size", "stream", "time_us", "frames"}, set(e))
            self.assertEqual([], e["frames"])
        times = [e["time_us"] for e in entries]
        self.assertEqual(sorted(times), times)

    def test_pytorchs_memory_viz_reads_it(self):
        viz = _memory_viz()
        if viz is None:
            if os.environ.get("ARCPOOL_REQUIRE_MEMORY_VIZ") == "1":
                self.fail("ARCPOOL_REQUIRE_MEMORY_VIZ=1 but ARCPOOL_MEMORY_VIZ is not set")
            self.skipTest("ARCPOOL_MEMORY_VIZ does not name PyTorch's _memory_viz.py "
                          "(tools/fetch-memory-viz DIR fetches it)")
        stats = self.facts["stats"]
        script = os.environ["ARCPOOL_MEMORY_VIZ"]
        summary = subprocess.run([sys.executable, script, "stats", self.path], check=True,
                                 capture_output=True, text=True).stdout
        # segsum raises when block sizes do not add up to their segments; its totals are ours.
        self.assertIn(f"total_reserved: {viz._format_size(stats['arcpool.bytes_held_current'])}\n",
                      summary)
        self.assertIn(f"total_allocated: {viz._format_size(stats['arcpool.bytes_in_use_current'])}\n",
                      summary)
        self.assertIn(f"segments: {len(self.data['segments'])}\n", summary)
        trace = subprocess.run([sys.executable, script, "trace", self.path], check=True,
                               capture_output=True, text=True).stdout
        lines = trace.splitlines()
        self.assertEqual("Device 0 ----------------", lines[0])
        self.assertEqual(f"{len(self.data['device_traces'][0])} entries", lines[1])
        body = lines[2:]
        self.assertEqual(3, sum("= cudaMalloc(" in line
                                for line in body))
        self.assertEqual(2, sum(line.startswith("del ") for line in body))
        self.assertEqual(1, sum(line.startswith("cudaFree(") for line in body))

    def test_torchs_snapshot_covers_every_device(self):
        # torch.cuda.memory._snapshot() (and _dump_snapshot) cover every device, whatever the
        # device argument: one list of trace entries per device, at its index.
        done = _run_child(textwrap.dedent("""
            import json, pickle, sys
            import arcpool, arcpool.torch
            lib = arcpool._lib.lib
            pointers = {d: lib.arcpool_malloc_async(4096 * (d + 1), d, None) for d in (0, 2)}
            assert all(pointers.values()), lib.arcpool_last_error()
            arcpool.torch._dump_snapshot(sys.argv[1])
            with open(sys.argv[1], "rb") as f:
                dumped = pickle.load(f)
            snapshot = arcpool.torch._snapshot(device=0)
            assert snapshot == dumped
            print(json.dumps({"pointers": pointers, "snapshot": snapshot}))
        """), 1000, self.path + ".all")
        self.assertEqual(0, done.returncode, done.stderr)
        facts = json.loads(done.stdout.strip().splitlines()[-1])
        snapshot, pointers = facts["snapshot"], facts["pointers"]
        self.assertEqual(3, len(snapshot["device_traces"]))
        self.assertEqual([], snapshot["device_traces"][1], "device 1 has no allocator")
        for device in (0, 2):
            allocs = [e for e in snapshot["device_traces"][device] if e["action"] == "alloc"]
            self.assertEqual([pointers[str(device)]], [e["addr"] for e in allocs])
            self.assertEqual([4096 * (device + 1)], [e["size"] for e in allocs])
        self.assertEqual({0, 2}, {s["device"] for s in snapshot["segments"]})

    def test_torchs_snapshot_skips_a_device_without_history(self):
        # One device's allocator made without a history (ARCPOOL_HISTORY unset by then) takes
        # nothing from the others' snapshot.
        done = _run_child(textwrap.dedent("""
            import os
            import arcpool, arcpool.torch
            lib = arcpool._lib.lib
            assert lib.arcpool_malloc_async(4096, 0, None), lib.arcpool_last_error()
            del os.environ["ARCPOOL_HISTORY"]
            assert lib.arcpool_malloc_async(4096, 1, None), lib.arcpool_last_error()
            snapshot = arcpool.torch._snapshot()
            assert len(snapshot["device_traces"]) == 1, snapshot
            assert snapshot["device_traces"][0], snapshot
        """), 1000)
        self.assertEqual(0, done.returncode, done.stderr)

    def test_torchs_snapshot_raises_when_a_devices_snapshot_fails(self):
        # Only a device without history is skipped: one whose snapshot failed otherwise (no host
        # memory for it) raises, instead of leaving the device out of the dictionary unsaid.
        done = _run_child(textwrap.dedent("""
            import arcpool, arcpool.torch
            lib = arcpool._lib.lib
            for d in (0, 1):
                assert lib.arcpool_malloc_async(4096, d, None), lib.arcpool_last_error()
            real = arcpool.memory_snapshot
            def failing(device=0):
                if device == 1:
                    raise arcpool.ArcpoolError(2, "arcpool_memory_snapshot")  # OUT_OF_MEMORY
                return real(device)
            arcpool.memory_snapshot = failing
            try:
                arcpool.torch._snapshot()
            except arcpool.ArcpoolError as e:
                print(e.status)
            else:
                raise SystemExit("device 1 was left out without a word")
        """), 1000)
        self.assertEqual(0, done.returncode, done.stderr)
        self.assertIn("ARCPOOL_STATUS_OUT_OF_MEMORY", done.stdout)

    def test_without_history_the_snapshot_says_how_to_turn_it_on(self):
        done = _run_child(textwrap.dedent("""
            import arcpool
            try:
                arcpool.memory_snapshot()
            except arcpool.ArcpoolError as e:
                print(e)
            else:
                raise SystemExit("a snapshot without history")
        """), None)
        self.assertEqual(0, done.returncode, done.stderr)
        self.assertIn("ARCPOOL_HISTORY", done.stdout)


if __name__ == "__main__":
    unittest.main()
