"""The CUDA runtime for the Python tests that make CUDA calls of their own (ctypes): the GPU's,
or simcuda's where LD_LIBRARY_PATH names it (the simcuda presets, device-check --simulated)."""
import ctypes


def load():
    """libcudart through ctypes, or None where there is none."""
    for name in ("libcudart.so.13", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None
