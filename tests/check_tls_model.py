#!/usr/bin/env python3
"""Checks how arcpool's shared libraries reach their thread-local state (design.md §7).

For each library given:
  - no initial-exec TLS (no DF_STATIC_TLS flag, no R_X86_64_TPOFF relocation): a library that
    Python dlopens after torch-sized libraries have taken the static TLS block must still load;
  - with --descriptors: every thread-local goes through TLS descriptors (R_X86_64_TLSDESC) and
    the library does not import __tls_get_addr, whose call on every access the fast path
    cannot afford.

usage: check_tls_model.py [--descriptors] LIBRARY...
"""
import subprocess
import sys


def readelf(*args):
    return subprocess.run(["readelf", "-W", *args], check=True, capture_output=True,
                          text=True).stdout


def main(argv):
    descriptors = "--descriptors" in argv
    libraries = [a for a in argv if a != "--descriptors"]
    if not libraries:
        sys.exit(__doc__)
    failures = []
    for lib in libraries:
        dynamic = readelf("-d", lib)
        relocations = readelf("-r", lib)
        imports = subprocess.run(["nm", "-D", "--undefined-only", lib], check=True,
                                 capture_output=True, text=True).stdout
        if "STATIC_TLS" in dynamic:
            failures.append(f"{lib}: DF_STATIC_TLS is set (initial-exec TLS)")
        if "R_X86_64_TPOFF" in relocations:
            failures.append(f"{lib}: R_X86_64_TPOFF relocations (initial-exec TLS)")
        if descriptors:
            if "__tls_get_addr" in imports:
                failures.append(f"{lib}: imports __tls_get_addr (general-dynamic TLS)")
            if "TLSDESC" not in relocations:
                failures.append(f"{lib}: no R_X86_64_TLSDESC relocation (TLS descriptors off?)")
        print(f"{lib}: {relocations.count('TLSDESC')} TLS descriptor relocations")
    for f in failures:
        print("check_tls_model: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
