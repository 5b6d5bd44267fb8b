#!/usr/bin/env python3
"""tools/mutation-test's run_test: a test that passes is True, one that fails is False, and one
that runs past its time limit is False (a mutation that makes its test hang is caught), never an
exception that stops the harness (CI once failed that way, a mutant's test hanging for 600 s).

Usage: check_mutation_harness.py TOOLS_DIR. Prints "mutation harness ok".
"""
import importlib.machinery
import importlib.util
import os
import sys
import time


def load(path):
    loader = importlib.machinery.SourceFileLoader("mutation_test", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def main():
    harness = load(os.path.join(sys.argv[1], "mutation-test"))
    row = {"env": {}}
    for code, expected in (("raise SystemExit(0)", True), ("raise SystemExit(1)", False),
                           ("import time; time.sleep(60)", False)):
        harness.test_command = lambda build_dir, m, *extra, c=code: [sys.executable, "-c", c]
        start = time.monotonic()
        passed = harness.run_test("unused", row, timeout=2)
        took = time.monotonic() - start
        if passed != expected or took > 30:
            sys.exit(f"run_test of {code!r}: {passed} after {took:.1f} s, expected {expected}")
    print("mutation harness ok")


if __name__ == "__main__":
    main()
