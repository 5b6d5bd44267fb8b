#!/usr/bin/env python3
"""The tools refuse bad input with a clear error and a failing exit status.

Usage: check_tool_input.py ARCPOOL_STRESS ARCPOOL_REPLAY TRACE_DIR
Runs each case on the host driver and checks its exit status and that standard error names the
problem. Prints "tool input ok" when every case holds. Before, arcpool-replay took a folder, a
file that is not a log and unknown actions for an empty or shorter trace, a mistyped --driver for
auto and "64G" for 64 bytes, and both tools exited 0 without writing an unwritable --json.
"""
import os
import subprocess
import sys
import tempfile


def run(command):
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stderr


def main():
    stress, replay, traces = sys.argv[1:4]
    trace = os.path.join(traces, "dataframe.csv")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        not_a_log = os.path.join(tmp, "other.csv")
        with open(not_a_log, "w") as f:
            f.write("a,b,c\n1,2,3\n")
        unknown_action = os.path.join(tmp, "deallocate.csv")
        with open(unknown_action, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream\n"
                    "1,12:00:00.000001,allocate,0x7f0000000000,4096,0\n"
                    "1,12:00:00.000002,deallocate,0x7f0000000000,4096,0\n")
        short_row = os.path.join(tmp, "short.csv")
        with open(short_row, "w") as f:
            f.write("Thread,Time,Action,Pointer,Size,Stream\n1,12:00:00.000001,allocate\n")
        unwritable = os.path.join(tmp, "no-such-folder", "out.json")
        cases = [
            ([replay, "--driver", "host", traces], "is not an allocation log"),
            ([replay, "--driver", "host", not_a_log], "is not an allocation log"),
            ([replay, "--driver", "host", unknown_action], 'action "deallocate"'),
            ([replay, "--driver", "host", short_row], "3 fields, not RMM's 6"),
            ([replay, "--driver", "gpu", trace], "--driver gpu"),
            ([replay, "--driver", "host", "--capacity", "64G", trace], "--capacity 64G"),
            ([replay, "--driver", "host", "--json", unwritable, trace], "cannot write"),
            ([stress, "--driver", "gpu", "--ops", "10"], "--driver gpu"),
            ([stress, "--driver", "host", "--ops", "10", "--json", unwritable], "cannot write"),
        ]
        for command, expected in cases:
            status, err = run(command)
            if status == 0 or expected not in err:
                failures.append(f"{' '.join(command[1:])}: exit {status}, stderr {err!r} "
                                f"(expected a failure naming {expected!r})")
    for failure in failures:
        print(failure)
    if failures:
        return 1
    print("tool input ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
