#!/usr/bin/env python3
"""The long-running tools draw a progress line on a terminal and stay quiet otherwise.

Usage: check_progress.py ARCPOOL_STRESS ARCPOOL_REPLAY
Runs each tool twice on the host driver: with standard error on a pseudo-terminal, where the
progress line (label, count, rate, time left) must appear, and with standard error on a pipe,
where no progress line may appear. Prints "progress ok" when both hold for both tools. The
replay runs a generated trace long enough to draw (a line appears after 250 ms).
"""
import os
import pty
import re
import subprocess
import sys
import tempfile

LINE = re.compile(rb"\r(arcpool-stress|arcpool|raw driver pool): \d+ (operations|events), "
                  rb"\d+/s, \d+ s left")


def on_terminal(command):
    """Standard error of `command` when it is a terminal (standard output: a pipe)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.communicate()[0]
    os.close(master)
    return proc.returncode, out, err


def on_pipe(command):
    proc = subprocess.run(command, capture_output=True)
    return proc.returncode, proc.stdout, proc.stderr


def write_trace(path, events):
    """A trace of `events` rows on two streams: allocations, each freed 64 rows later."""
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n")
        live = []
        for i in range(events // 2):
            pointer = 0x7F0000000000 + i * 0x10000
            f.write(f"1,12:00:00.000000,allocate,{hex(pointer)},4096,{hex(0x1000 * (1 + i % 2))}\n")
            live.append(pointer)
            if len(live) > 64:
                f.write(f"1,12:00:00.000000,free,{hex(live.pop(0))},4096,0x1000\n")


def main():
    stress, replay = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as folder:
        trace = os.path.join(folder, "long.csv")
        write_trace(trace, 200_000)
        return check(stress, replay, trace)


def check(stress, replay, trace):
    tools = {
        "arcpool-stress": [stress, "--driver", "host", "--seconds", "1.5"],
        "arcpool-replay": [replay, "--driver", "host", trace],
    }
    failed = False
    for name, command in tools.items():
        rc, out, err = on_terminal(command)
        if rc != 0 or not LINE.search(err):
            print(f"{name}: no progress line on a terminal (exit {rc}); stderr: {err[-400:]!r}")
            failed = True
        if b"\r" in out:
            print(f"{name}: the progress line went to standard output")
            failed = True
        rc, out, err = on_pipe(command)
        if rc != 0 or b"\r" in err or b"\r" in out:
            print(f"{name}: progress drawn while standard error is a pipe (exit {rc}); "
                  f"stderr: {err[-400:]!r}")
            failed = True
    if failed:
        return 1
    print("progress ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
