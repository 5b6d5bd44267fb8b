"""python -m arcpool plot: a log and a replay series render, and their peaks are the replay's.

Needs matplotlib (skipped without it, unless ARCPOOL_REQUIRE_PLOT=1 makes that a failure) and,
for the comparison with arcpool-replay, ARCPOOL_REPLAY naming the arcpool-replay binary. The
trace is the smallest in ARCPOOL_TRACE_DIR when that names a folder of traces, else the
repository's synthetic bench/traces/training_comm.csv.
"""
import glob
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("ARCPOOL_REQUIRE_PLOT") == "1"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _need(condition, reason):
    if condition:
        return
    if REQUIRED:
        raise AssertionError(f"ARCPOOL_REQUIRE_PLOT=1, but {reason}")
    raise unittest.SkipTest(reason)


def _trace():
    folder = os.environ.get("ARCPOOL_TRACE_DIR")
    if folder:
        traces = sorted(glob.glob(os.path.join(folder, "*.csv")), key=os.path.getsize)
        if traces:
            return traces[0]
    return str(ROOT / "bench" / "traces" / "training_comm.csv")


def _plot(*args):
    return subprocess.run([sys.executable, "-m", "arcpool", "plot", *args],
                          capture_output=True, text=True)


class Plot(unittest.TestCase):
    def setUp(self):
        _need(importlib.util.find_spec("matplotlib") is not None, "matplotlib is not installed")
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = pathlib.Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def render(self, source, name):
        png = self.dir / f"{name}.png"
        done = _plot(source, "-o", str(png))
        self.assertEqual(0, done.returncode, done.stderr)
        self.assertEqual(PNG_SIGNATURE, png.read_bytes()[:8], f"{png} is not a PNG")
        with open(self.dir / f"{name}.json") as f:
            return json.load(f)

    def test_a_log_and_a_replay_series_peak_where_arcpool_replay_does(self):
        replay = os.environ.get("ARCPOOL_REPLAY")
        _need(replay and os.path.exists(replay), "ARCPOOL_REPLAY does not name arcpool-replay")
        trace = _trace()
        result, series = self.dir / "replay.json", self.dir / "series.json"
        done = subprocess.run([replay, "--driver", "host", "--json", str(result), "--series",
                               str(series), trace], capture_output=True, text=True)
        self.assertEqual(0, done.returncode, done.stdout + done.stderr)
        with open(result) as f:
            replayed = json.load(f)["traces"][0]
        raw = next(m for m in replayed["modes"] if m["mode"] == "raw driver pool")
        self.assertEqual(replayed["peak_live"], raw["peak_in_use"])

        from_log = self.render(trace, "log")
        self.assertEqual(replayed["peak_live"], from_log["peaks"]["total.in_use"], trace)
        self.assertEqual(replayed["events"], len(from_log["time_s"]), "one point per event")

        from_replay = self.render(str(series), "series")
        self.assertEqual(replayed["peak_live"], from_replay["peaks"]["total.in_use"])
        for name in ("held", "cached"):
            self.assertIn(f"total.{name}", from_replay["peaks"])
        self.assertGreaterEqual(from_replay["peaks"]["total.held"],
                                from_replay["peaks"]["total.in_use"])
        # The replay's streams are the log's, with the same bytes in use after every event.
        self.assertEqual(from_log["streams"].keys(), from_replay["streams"].keys())
        for key, figures in from_log["streams"].items():
            self.assertEqual(figures["in_use"], from_replay["streams"][key]["in_use"], key)

    def test_the_bytes_in_use_of_every_stream_add_up_to_the_total(self):
        from_log = self.render(_trace(), "log")
        per_stream = [figures["in_use"] for figures in from_log["streams"].values()]
        self.assertEqual(from_log["total"]["in_use"], [sum(v) for v in zip(*per_stream)])

    def test_bad_input_is_a_clear_error_and_writes_nothing(self):
        missing = _plot(str(self.dir / "missing.csv"), "-o", str(self.dir / "x.png"))
        self.assertEqual(1, missing.returncode)
        self.assertIn("missing.csv", missing.stderr)
        other = self.dir / "other.json"
        other.write_text('{"traces": []}')
        wrong = _plot(str(other), "-o", str(self.dir / "y.png"))
        self.assertEqual(1, wrong.returncode)
        self.assertIn("not an arcpool-replay --series file", wrong.stderr)
        self.assertFalse((self.dir / "x.png").exists() or (self.dir / "y.png").exists())


class LogSeries(unittest.TestCase):
    """The log's series alone: no matplotlib needed."""

    def test_a_null_pointer_in_either_spelling_is_a_zero_byte_allocation(self):
        # A zero-byte allocation's null pointer: arcpool writes 0x0 (RMM's parser reads it),
        # RMM's printf-style writer "(nil)". The plot refused "(nil)" ("invalid literal for int()
        # with base 16").
        from arcpool import plot
        with tempfile.TemporaryDirectory() as tmp:
            log = pathlib.Path(tmp) / "log.csv"
            log.write_text("Thread,Time,Action,Pointer,Size,Stream\n"
                           "1,12:00:00.000001,allocate,(nil),0,0\n"
                           "1,12:00:00.000002,allocate,0x7f0000000000,4096,5\n"
                           "1,12:00:00.000003,free,(nil),0,0\n"
                           "1,12:00:00.000004,allocate,0x0,0,0\n"
                           "1,12:00:00.000005,free,0x0,0,0\n"
                           "1,12:00:00.000006,free,0x7f0000000000,4096,5\n")
            series = plot.series_from_log(str(log))
        self.assertEqual([0, 4096, 4096, 4096, 4096, 0], series["total"]["in_use"])
        self.assertEqual({"0x0", "0x5"}, set(series["streams"]))

    def test_a_replay_series_has_the_logs_streams_when_a_stream_only_frees(self):
        # inference_server.csv frees on stream 0x3000, which allocates nothing: bytes count on
        # the stream that allocated them, so neither the log's series nor the replay's has it
        # (the replay's had it, all zeros).
        replay = os.environ.get("ARCPOOL_REPLAY")
        if not (replay and os.path.exists(replay)):
            self.skipTest("ARCPOOL_REPLAY does not name arcpool-replay")
        from arcpool import plot
        trace = str(ROOT / "bench" / "traces" / "inference_server.csv")
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp) / "series.json"
            done = subprocess.run([replay, "--driver", "host", "--series", str(out), trace],
                                  capture_output=True, text=True)
            self.assertEqual(0, done.returncode, done.stdout + done.stderr)
            with open(out) as f:
                from_replay = json.load(f)
        from_log = plot.series_from_log(trace)
        self.assertNotIn("0x3000", from_log["streams"])
        self.assertEqual(set(from_log["streams"]), set(from_replay["streams"]))


if __name__ == "__main__":
    unittest.main()
