"""Finds and loads arcpool's shared libraries with ctypes (no compiled extension)."""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates(name):
    env = os.environ.get("ARCPOOL_LIBRARY_DIR")
    if env:
        yield os.path.join(env, name)
    # arcpool/lib: the installed wheel's (pip install .) or build/python/arcpool/lib's copy
    yield os.path.join(_HERE, "lib", name)
    root = os.path.dirname(os.path.dirname(_HERE))
    for build in ("build", "build-release", "build-gpu"):
        yield os.path.join(root, build, "python", "arcpool", "lib", name)
    yield name  # the system's search path (an installed arcpool)


def load(name):
    """Loads `name` (e.g. libarcpool.so.0) from the first place it is found."""
    errors = []
    for path in _candidates(name):
        if os.path.sep in path and not os.path.exists(path):
            continue
        try:
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError(
        f"arcpool: cannot load {name}; install arcpool (pip install .), build it (cmake "
        f"--workflow --preset default) or set ARCPOOL_LIBRARY_DIR. Tried: "
        + "; ".join(errors or [name])
    )


lib = load("libarcpool.so.0")

lib.arcpool_version.restype = ctypes.c_int
lib.arcpool_auto_driver.argtypes = [ctypes.c_int]
lib.arcpool_auto_driver.restype = ctypes.c_int
lib.arcpool_driver_name.argtypes = [ctypes.c_int]
lib.arcpool_driver_name.restype = ctypes.c_char_p
lib.arcpool_last_error.restype = ctypes.c_char_p
lib.arcpool_status_string.argtypes = [ctypes.c_int]
lib.arcpool_status_string.restype = ctypes.c_char_p
lib.arcpool_default_allocator_get.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
lib.arcpool_default_allocator_get.restype = ctypes.c_int
lib.arcpool_default_allocator_find.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
lib.arcpool_default_allocator_find.restype = ctypes.c_int
lib.arcpool_allocator_driver.argtypes = [ctypes.c_void_p]
lib.arcpool_allocator_driver.restype = ctypes.c_int
lib.arcpool_stats_json.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.POINTER(ctypes.c_size_t)]
lib.arcpool_stats_json.restype = ctypes.c_int
lib.arcpool_stats_reset_peaks.argtypes = [ctypes.c_void_p]
lib.arcpool_stats_reset_peaks.restype = ctypes.c_int
lib.arcpool_allocator_trim.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.arcpool_allocator_trim.restype = ctypes.c_int
lib.arcpool_malloc_async.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.arcpool_malloc_async.restype = ctypes.c_void_p
lib.arcpool_free_async.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_void_p]
lib.arcpool_free_async.restype = ctypes.c_int
lib.arcpool_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.arcpool_record_stream.restype = ctypes.c_int
lib.arcpool_memory_snapshot.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.POINTER(ctypes.c_size_t)]
lib.arcpool_memory_snapshot.restype = ctypes.c_int
for _name in ("arcpool_stream_register", "arcpool_stream_unregister"):
    getattr(lib, _name).argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    getattr(lib, _name).restype = ctypes.c_int
lib.arcpool_graph_pool_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.arcpool_graph_pool_create.restype = ctypes.c_int
for _name in ("arcpool_graph_pool_begin", "arcpool_graph_pool_end"):
    getattr(lib, _name).argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    getattr(lib, _name).restype = ctypes.c_int
lib.arcpool_graph_pool_release.argtypes = [ctypes.c_void_p]
lib.arcpool_graph_pool_release.restype = ctypes.c_int


class ArcpoolError(RuntimeError):
    """A failed arcpool call: `status` names the status, the message is arcpool's."""

    def __init__(self, status, what):
        self.status = lib.arcpool_status_string(status).decode()
        super().__init__(f"{what}: {lib.arcpool_last_error().decode()}")


def check(status, what):
    """Raises ArcpoolError unless `status` is success."""
    if status != 0:
        raise ArcpoolError(status, what)


def default_allocator(device=0):
    """The allocator serving `device`'s raw-pointer entry points (created on first use)."""
    handle = ctypes.c_void_p()
    check(lib.arcpool_default_allocator_get(device, ctypes.byref(handle)),
          "arcpool_default_allocator_get")
    return handle


def existing_allocator(device=0):
    """The allocator serving `device`'s raw-pointer entry points, or None while it has none
    (never created: creating one would create a CUDA context on the device)."""
    handle = ctypes.c_void_p()
    check(lib.arcpool_default_allocator_find(device, ctypes.byref(handle)),
          "arcpool_default_allocator_find")
    return handle if handle.value else None
