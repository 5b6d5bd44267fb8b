"""arcpool as PyTorch's CUDA allocator, through torch.cuda.memory.CUDAPluggableAllocator.

    import arcpool.torch
    arcpool.torch.install()      # before the first CUDA tensor
    ...
    arcpool.torch.stats()        # PyTorch cannot see a pluggable allocator's statistics

install() wires every hook PyTorch accepts as a C function pointer: alloc / free (the free
receives the allocation stream), record_stream (Tensor.record_stream becomes an arcpool use
record: without it record_stream would silently do nothing), empty_cache and memory fraction
(a hard limit enforced by arcpool's counter). Each device's allocator is created on its first
allocation.

CUDA graph capture is not supported yet: PyTorch's graph-pool hooks take C++ types and need a
shim built against libtorch. An allocation on a capturing stream raises RuntimeError with
arcpool's UNSUPPORTED message, never an out-of-memory.
"""
import ctypes
import os

from . import _lib

_installed = None


def _function_pointer(library, name):
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def _shim_path():
    shim = None
    for candidate in _lib._candidates("libarcpool_torch.so"):
        if os.path.exists(candidate):
            shim = candidate
            break
    if shim is None:
        raise ImportError("arcpool: libarcpool_torch.so not found (build arcpool's python "
                          "target, or set ARCPOOL_LIBRARY_DIR)")
    return shim


def install():
    """Makes arcpool PyTorch's CUDA allocator. Must run before the first CUDA tensor (PyTorch
    cannot swap an allocator that has allocated); raises RuntimeError otherwise."""
    global _installed
    import torch

    if _installed is not None:
        return _installed
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # PyTorch refuses to swap an initialized allocator; say why, in our words.
        raise RuntimeError(
            "arcpool.torch.install() must run before the first CUDA tensor: PyTorch's CUDA "
            "allocator is already initialized in this process")
    path = _shim_path()
    shim = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        path, "arcpool_torch_malloc", "arcpool_torch_free")
    native = allocator.allocator()
    hooks = {
        "set_record_stream_fn": "arcpool_torch_record_stream",
        "set_reset_fn": "arcpool_torch_empty_cache",
        "set_memory_fraction_fn": "arcpool_torch_set_memory_fraction",
    }
    for setter, function in hooks.items():
        set_hook = getattr(native, setter, None)
        if set_hook is None:
            if setter == "set_record_stream_fn":
                raise RuntimeError("arcpool: this PyTorch cannot set a record_stream hook; "
                                   "refusing to install (record_stream would do nothing)")
            continue
        set_hook(_function_pointer(shim, function))
    torch.cuda.memory.change_current_allocator(allocator)
    _installed = (allocator, shim)
    return _installed


def stats(device=0):
    """arcpool's statistics with torch.cuda.memory_stats()-style keys (see arcpool.stats)."""
    from . import stats as arcpool_stats

    return arcpool_stats(device)
