"""Memory over time, drawn with matplotlib.

    python -m arcpool plot LOG.csv -o memory.png        # an allocation log (RMM's CSV columns)
    python -m arcpool plot SERIES.json -o memory.png    # arcpool-replay --series SERIES.json

An allocation log (ARCPOOL_LOG, RMM's logging resource, or any file of RMM's columns
Thread,Time,Action,Pointer,Size,Stream) gives the bytes in use per stream: an allocation counts
on the stream that made it until it is freed. A replay series (`arcpool-replay --series`) gives
the same per stream, and arcpool's bytes in use, held and cached after every event of a replay
through the allocator. Next to the picture goes the plotted data as JSON (`--json`, by default
the picture's name with .json): the same series, and the peak of each.
"""
import argparse
import csv
import json
import os
import sys


def _seconds(text):
    """The Time column (HH:MM:SS.ffffff) in seconds of the day; 0 when it does not parse."""
    try:
        hours, minutes, seconds = text.split(":")
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds)
    except ValueError:
        return 0.0


def _handle(text):
    """A Pointer or Stream column as a number: hexadecimal, with or without 0x; a null pointer
    as glibc's %p writes it ("(nil)", as RMM's printf-style writer does) or empty is 0."""
    return 0 if text in ("", "(nil)") else int(text, 16)


def series_from_log(path):
    """The bytes in use per stream after every allocate and free row of the log at `path`.

    Rows are counted as arcpool-replay counts them: an allocation of a pointer already live, or a
    free of a pointer the log never allocated (freed before the log began), is skipped; other
    actions ("allocate failure") are ignored."""
    time, streams, live = [], {}, {}
    first, day, last = None, 0.0, 0.0
    with open(path, newline="") as f:
        rows = csv.reader(f)
        next(rows, None)  # the header
        for row in rows:
            if len(row) < 6 or row[2] not in ("allocate", "free"):
                continue
            at = _seconds(row[1]) + day
            if at + 12 * 3600 < last:  # past midnight
                day += 24 * 3600
                at += 24 * 3600
            last = at
            first = at if first is None else first
            pointer, stream = _handle(row[3]), row[5]
            if row[2] == "allocate":
                if pointer in live:
                    continue
                size = int(row[4])
                live[pointer] = (size, stream)
            else:
                if pointer not in live:
                    continue
                size, stream = live.pop(pointer)
                size = -size
            key = hex(_handle(stream))
            if key not in streams:
                streams[key] = [0] * len(time)
            for other in streams.values():
                other.append(other[-1] if other else 0)
            streams[key][-1] += size
            time.append(at - first)
    in_use = [sum(values) for values in zip(*streams.values())] if streams else []
    return {"source": "log", "trace": os.path.basename(path), "time_s": time,
            "streams": {key: {"in_use": values} for key, values in streams.items()},
            "total": {"in_use": in_use}}


def load(path):
    """A series from a log (.csv) or from arcpool-replay --series (.json)."""
    if path.endswith(".json"):
        with open(path) as f:
            series = json.load(f)
        if series.get("source") != "arcpool-replay":
            raise ValueError(f"{path}: not an arcpool-replay --series file")
        return series
    return series_from_log(path)


def peaks(series):
    """The maximum of every plotted series: {"total.in_use": ..., "stream.0x0.in_use": ...}."""
    result = {f"total.{name}": max(values, default=0)
              for name, values in series["total"].items()}
    for key, figures in series["streams"].items():
        for name, values in figures.items():
            result[f"stream.{key}.{name}"] = max(values, default=0)
    return result


def draw(series, png):
    """Draws `series` into the PNG file `png`: the bytes in use per stream, and arcpool's
    totals (in use, held, cached) when the series has them."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    totals = {name: values for name, values in series["total"].items() if name != "in_use"}
    rows = 2 if totals else 1
    figure, axes = plt.subplots(rows, 1, figsize=(10, 3.2 * rows), sharex=True, squeeze=False)
    time = series["time_s"]
    top = axes[0][0]
    for key, figures in series["streams"].items():
        top.step(time, [v / 2**20 for v in figures["in_use"]], where="post",
                 label=f"stream {key}")
    top.step(time, [v / 2**20 for v in series["total"]["in_use"]], where="post", color="black",
             linewidth=0.8, label="all streams")
    top.set_ylabel("MiB in use")
    top.set_title(f"{series.get('trace', '')}: bytes in use per stream")
    top.legend(loc="upper right", fontsize="small")
    if totals:
        bottom = axes[1][0]
        for name in ("in_use", "held", "cached"):
            values = series["total"].get(name)
            if values is not None:
                bottom.step(time, [v / 2**20 for v in values], where="post", label=name)
        bottom.set_ylabel("MiB")
        bottom.set_title("arcpool: bytes in use, held and cached")
        bottom.legend(loc="upper right", fontsize="small")
    axes[-1][0].set_xlabel("seconds since the first event")
    figure.tight_layout()
    figure.savefig(png, dpi=100)
    plt.close(figure)


def main(argv=None):
    """`python -m arcpool plot INPUT -o PNG [--json JSON]`; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m arcpool plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", help="an allocation log (.csv) or arcpool-replay --series (.json)")
    parser.add_argument("-o", "--output", required=True, help="the picture (PNG)")
    parser.add_argument("--json", help="the plotted series (default: the picture's name, .json)")
    args = parser.parse_args(argv)
    try:
        series = load(args.input)
    except (OSError, ValueError, KeyError) as e:
        print(f"arcpool plot: {e}", file=sys.stderr)
        return 1
    try:
        draw(series, args.output)
    except ImportError:
        print("arcpool plot: needs matplotlib (pip install matplotlib, or pip install "
              "'arcpool[plot]')", file=sys.stderr)
        return 1
    out = args.json or os.path.splitext(args.output)[0] + ".json"
    with open(out, "w") as f:
        json.dump(dict(series, peaks=peaks(series)), f)
    print(f"arcpool plot: {args.output} and {out} "
          f"(peak in use {peaks(series)['total.in_use']} bytes)")
    return 0
