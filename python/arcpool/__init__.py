"""arcpool: a stream-ordered, ownership-tracked CUDA device-memory allocator.

    import arcpool
    arcpool.DRIVER            # the driver arcpool would use here: "cuda" or "host"
    arcpool.stats()           # statistics of device 0's default allocator
    arcpool.dump_snapshot()   # its memory snapshot for PyTorch's memory_viz (ARCPOOL_HISTORY=N)
    arcpool.torch.install()   # PyTorch's allocator (before the first CUDA tensor)
    arcpool.cupy.install()    # CuPy's allocator
    arcpool.rmm.install()     # RMM's resource for device 0 (rmm.mr.CallbackMemoryResource)
    arcpool.ipc.Exporter(arcpool.ipc.SharedAllocator(), sock)  # memory for another process

Bindings are ctypes over libarcpool (no compiled extension); ARCPOOL_LIBRARY_DIR names the
folder holding libarcpool.so.0 if it is not found next to the package or in a build tree.
"""
import json
import pickle

from . import _lib
from ._lib import ArcpoolError, default_allocator

# Not DRIVER: a star import would read it, and asking for it initializes CUDA (__getattr__).
__all__ = ["VERSION", "ArcpoolError", "driver", "stats", "stream_stats", "reset_peak_stats",
           "empty_cache", "memory_snapshot", "dump_snapshot", "default_allocator"]

VERSION = _lib.lib.arcpool_version()

_DRIVER_AUTO = 0  # ARCPOOL_DRIVER_AUTO (arcpool.h)
_STATUS_INVALID_ARGUMENT = 1  # ARCPOOL_STATUS_INVALID_ARGUMENT (arcpool.h)


def driver(device=0):
    """The driver ARCPOOL_DRIVER_AUTO resolves to for `device` ("cuda", "host"), without
    creating an allocator: "cuda" whenever any device is usable (an allocator for a device
    that cannot serve then fails), "host" on a machine without one. ArcpoolError when
    ARCPOOL_DRIVER names no driver."""
    kind = _lib.lib.arcpool_auto_driver(device)
    if kind == _DRIVER_AUTO:
        raise ArcpoolError(_STATUS_INVALID_ARGUMENT, "arcpool_auto_driver")
    return _lib.lib.arcpool_driver_name(kind).decode()


# Keys shared with torch.cuda.memory_stats() where the meaning is the same; every arcpool
# figure is also given under "arcpool.<name>".
_TORCH_KEYS = {
    "allocated_bytes.all.current": "bytes_in_use_current",
    "allocated_bytes.all.peak": "bytes_in_use_peak",
    "reserved_bytes.all.current": "pool_reserved_bytes_current",
    "reserved_bytes.all.peak": "pool_reserved_bytes_peak",
    "allocation.all.current": "allocations_in_use_current",
    "allocation.all.peak": "allocations_in_use_peak",
    "allocation.all.allocated": "allocations",
    "allocation.all.freed": "deallocations",
    "requested_bytes.all.current": "bytes_in_use_current",
    "requested_bytes.all.peak": "bytes_in_use_peak",
    "num_alloc_retries": "oom_retries",
    "num_ooms": "oom_failures",
}


def _stats_json(device):
    """The statistics JSON of `device`'s default allocator. Other threads and the reclaim worker
    change the figures between the sizing call and the copy, and a number that gains a digit,
    or a new stream's row, makes the JSON longer: arcpool_stats_json then truncates it, and the
    copy is retried in a buffer of the new length. A device without an allocator reads all
    zeros: a query creates none, nor a CUDA context with it."""
    handle = _lib.existing_allocator(device)
    length = _lib.ctypes.c_size_t()
    _lib.check(_lib.lib.arcpool_stats_json(handle, None, 0, _lib.ctypes.byref(length)),
               "arcpool_stats_json")
    while True:
        buffer = _lib.ctypes.create_string_buffer(length.value + length.value // 4 + 256)
        _lib.check(_lib.lib.arcpool_stats_json(handle, buffer, len(buffer),
                                               _lib.ctypes.byref(length)),
                   "arcpool_stats_json")
        if length.value < len(buffer):  # the whole JSON and its NUL
            return buffer.value.decode()


def stats(device=0):
    """Statistics of `device`'s default allocator: torch.cuda.memory_stats()-style keys where the
    meaning is the same (PyTorch cannot see a pluggable allocator's), plus every arcpool figure
    as "arcpool.<name>"."""
    raw = json.loads(_stats_json(device))
    raw.pop("streams")  # stream_stats(): the dict holds numbers only, as torch's
    result = {key: raw[name] for key, name in _TORCH_KEYS.items()}
    result.update({"arcpool." + name: value for name, value in raw.items()})
    return result


def stream_stats(device=0):
    """Statistics per stream of `device`'s default allocator: one dict per stream with a row of
    its own (its handle as "stream", 0 for the legacy default stream, "stream_id", "retired"),
    then the row of every other stream ("other": 1), each with bytes_in_use_current,
    bytes_in_use_peak, allocations, cache_hits, cross_stream_frees and deferred_frees."""
    return json.loads(_stats_json(device))["streams"]


def reset_peak_stats(device=0):
    """Resets every peak of `device`'s default allocator to its current value (none to reset
    while the device has no allocator)."""
    handle = _lib.existing_allocator(device)
    if handle is not None:
        _lib.check(_lib.lib.arcpool_stats_reset_peaks(handle), "arcpool_stats_reset_peaks")


def empty_cache(device=0):
    """Gives back what `device`'s default allocator holds but does not use (nothing while the
    device has no allocator). Blocks."""
    handle = _lib.existing_allocator(device)
    if handle is not None:
        _lib.check(_lib.lib.arcpool_allocator_trim(handle, 0), "arcpool_allocator_trim")


def _snapshot_bytes(device):
    handle = default_allocator(device)
    size = _lib.ctypes.c_size_t()
    _lib.check(_lib.lib.arcpool_memory_snapshot(handle, None, 0, _lib.ctypes.byref(size)),
               "arcpool_memory_snapshot")
    while True:
        buffer = _lib.ctypes.create_string_buffer(size.value + size.value // 4 + 4096)
        status = _lib.lib.arcpool_memory_snapshot(handle, buffer, len(buffer),
                                                  _lib.ctypes.byref(size))
        if status == 0:
            return buffer.raw[:size.value]
        if size.value <= len(buffer):  # another failure than a snapshot that grew meanwhile
            _lib.check(status, "arcpool_memory_snapshot")


def memory_snapshot(device=0):
    """The memory snapshot of `device`'s default allocator: the dictionary
    torch.cuda.memory._snapshot() returns ("segments": one per block arcpool holds, "inactive"
    while cached; "device_traces": the history, oldest first). Needs the history, which is off
    unless ARCPOOL_HISTORY=N (the entries kept) was set before the allocator was created, that
    is before arcpool's first use of the device in this process; ArcpoolError otherwise."""
    return pickle.loads(_snapshot_bytes(device))


def dump_snapshot(filename="dump_snapshot.pickle", device=0):
    """Writes memory_snapshot(device), pickled as torch.cuda.memory._dump_snapshot() writes it,
    for PyTorch's torch/cuda/_memory_viz.py and https://pytorch.org/memory_viz."""
    data = _snapshot_bytes(device)
    with open(filename, "wb") as f:
        f.write(data)


def __getattr__(name):
    """Names resolved on first use. arcpool.torch / .cupy / .rmm load lazily: they need torch /
    cupy / rmm (arcpool.ipc needs nothing more, and loads lazily too). arcpool.DRIVER, the
    driver device 0 would use ("cuda" or "host"), is asked for then and kept: importing arcpool
    makes no CUDA call, so a process may import it and then fork workers that use CUDA (a child
    forked after its parent initialized CUDA cannot)."""
    if name in ("torch", "cupy", "rmm", "ipc"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    if name == "DRIVER":
        value = globals()["DRIVER"] = driver()
        return value
    raise AttributeError(name)
