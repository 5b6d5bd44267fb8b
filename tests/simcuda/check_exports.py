#!/usr/bin/env python3
"""Fails when a binary of the build imports a CUDA runtime symbol that simcuda does not export.

Usage: check_exports.py SIMCUDA_LIBRARY BUILD_DIR
Every ELF file under BUILD_DIR that needs libcudart.so.13 (executables and shared libraries) is
read with `nm -D --undefined-only`; each symbol it takes from libcudart.so.13 must be defined by
SIMCUDA_LIBRARY. Prints the binaries checked and the missing symbols, exit 1 when any is missing.
"""
import pathlib
import subprocess
import sys


def needs_cudart(path: pathlib.Path) -> bool:
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True)
    return out.returncode == 0 and "[libcudart.so.13]" in out.stdout


def is_elf(path: pathlib.Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def symbols(path: pathlib.Path, flag: str) -> set:
    out = subprocess.run(["nm", "-D", flag, str(path)], capture_output=True, text=True, check=True)
    return {line.split()[-1] for line in out.stdout.splitlines() if line.strip()}


def main() -> int:
    library, build = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    exported = {s.split("@")[0] for s in symbols(library, "--defined-only")}
    missing = {}
    checked = 0
    for path in sorted(build.rglob("*")):
        if not path.is_file() or path.is_symlink() or path.suffix in {".o", ".a"}:
            continue
        if "CMakeFiles" in path.parts or not is_elf(path) or path.resolve() == library.resolve():
            continue
        if not needs_cudart(path):
            continue
        checked += 1
        for sym in symbols(path, "--undefined-only"):
            name, _, version = sym.partition("@")
            if version.lstrip("@") == "libcudart.so.13" and name not in exported:
                missing.setdefault(name, []).append(str(path.relative_to(build)))
    for name, users in sorted(missing.items()):
        print(f"simcuda does not export {name}, imported by {', '.join(users)}")
    print(f"simcuda exports: {checked} binaries checked, {len(missing)} symbol(s) missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
