"""Pool memory shared with another process (docs/design.md §14), from Python: arcpool's IPC API
(include/arcpool/ipc.h) over ctypes, for processes that hand buffers to each other over a Unix
socket (inference servers and their workers, data-loading processes).

    # the exporting process
    allocator = arcpool.ipc.SharedAllocator(device=0)   # an owned pool another process may import
    exporter = arcpool.ipc.Exporter(allocator, sock)    # sock: connected AF_UNIX, SOCK_STREAM
    block = allocator.allocate(1 << 20, stream)         # an Allocation
    ...                                                 # work on block.ptr, queued on stream
    exporter.send(block)                                # the importer sees that work done
    block.deallocate(stream)                            # freed after the importer's free
    block.release()

    # the importing process
    importer = arcpool.ipc.Importer(sock)               # device 0's default allocator
    block = importer.receive(stream)                    # stream waits for the exporter's work
    ...
    block.deallocate(stream)                            # tells the exporter once it ran
    block.release()

Streams are CUDA stream handles (int), objects with `.ptr` (CuPy) or `.cuda_stream` (PyTorch), or
None for the legacy default stream. An Allocation exposes `__cuda_array_interface__` (bytes), so
`cupy.asarray(block)` and `torch.as_tensor(block, device="cuda")` see its memory without a copy.
The CUDA driver only: on the host driver the exporter and importer raise ArcpoolError
(UNSUPPORTED). PyTorch's own CUDA IPC cannot share a pluggable allocator's memory (it raises);
this module shares arcpool's.
"""
import ctypes
import os

from . import _lib
from ._lib import ArcpoolError, check, lib

__all__ = ["SharedAllocator", "Allocation", "Exporter", "Importer", "ArcpoolError"]

_POSIX_FILE_DESCRIPTOR = 1  # cudaMemHandleTypePosixFileDescriptor
_POOL_OWNED = 0  # ARCPOOL_POOL_OWNED
_OPTIONS_VERSION = 1  # ARCPOOL_ALLOCATOR_OPTIONS_VERSION


class _Options(ctypes.Structure):
    """arcpool_allocator_options_t, version 1 (include/arcpool/arcpool.h). Its size is checked
    against the library's at the first use: a mismatch raises instead of passing bad options."""

    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint32),
        ("device", ctypes.c_int),
        ("driver", ctypes.c_int),
        ("pool_source", ctypes.c_int),
        ("release_threshold", ctypes.c_uint64),
        ("reuse_follow_event_dependencies", ctypes.c_int),
        ("reuse_allow_opportunistic", ctypes.c_int),
        ("reuse_allow_internal_dependencies", ctypes.c_int),
        ("max_pool_bytes", ctypes.c_size_t),
        ("hard_limit_bytes", ctypes.c_size_t),
        ("ipc_handle_types", ctypes.c_uint32),
        ("peer_devices", ctypes.c_void_p),
        ("peer_device_count", ctypes.c_size_t),
        ("foreign_stream_routing", ctypes.c_int),
        ("use_record_routing", ctypes.c_int),
        ("stream_cache_bytes", ctypes.c_size_t),
        ("stream_cache_max_block", ctypes.c_size_t),
        ("host_capacity_bytes", ctypes.c_size_t),
        ("host_reserve_only", ctypes.c_int),
        ("host_deterministic_seed", ctypes.c_uint64),
        ("event_pool_capacity", ctypes.c_size_t),
        ("on_out_of_memory", ctypes.c_void_p),
        ("on_out_of_memory_user_data", ctypes.c_void_p),
        ("before_free", ctypes.c_void_p),
        ("before_free_user_data", ctypes.c_void_p),
        ("history_entries", ctypes.c_size_t),
    ]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
for _name, _args, _res in (
    ("arcpool_allocator_options_init", [ctypes.POINTER(_Options)], None),
    ("arcpool_allocator_create", [ctypes.POINTER(_Options), _PP], ctypes.c_int),
    ("arcpool_allocator_destroy", [_P], None),
    ("arcpool_allocate_async", [_P, ctypes.c_size_t, ctypes.c_size_t, _P, ctypes.c_uint32, _PP],
     ctypes.c_int),
    ("arcpool_deallocate_async", [_P, _P, ctypes.c_uint32], ctypes.c_int),
    ("arcpool_allocation_release", [_P], ctypes.c_int),
    ("arcpool_allocation_data", [_P, _PP], ctypes.c_int),
    ("arcpool_allocation_size", [_P], ctypes.c_size_t),
    ("arcpool_ipc_exporter_create", [_P, ctypes.c_int, _PP], ctypes.c_int),
    ("arcpool_ipc_send", [_P, _P], ctypes.c_int),
    ("arcpool_ipc_exporter_outstanding", [_P, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int),
    ("arcpool_ipc_exporter_destroy", [_P], None),
    ("arcpool_ipc_importer_create", [_P, ctypes.c_int, _PP], ctypes.c_int),
    ("arcpool_ipc_receive", [_P, _P, _PP], ctypes.c_int),
    ("arcpool_ipc_importer_destroy", [_P], None),
):
    getattr(lib, _name).argtypes = _args
    getattr(lib, _name).restype = _res


def _stream(stream):
    """A CUDA stream handle from `stream`: None (the legacy default stream), an int, or an object
    with `.ptr` (CuPy) or `.cuda_stream` (PyTorch)."""
    if stream is None:
        return None
    for attribute in ("ptr", "cuda_stream"):
        if hasattr(stream, attribute):
            return getattr(stream, attribute) or None
    if isinstance(stream, int):
        return stream or None
    raise TypeError(f"not a CUDA stream: {stream!r} (an int, an object with .ptr or "
                    f".cuda_stream, or None)")


def _socket_fd(sock):
    """A duplicate of the socket's descriptor, for arcpool to own: the caller keeps its socket
    (closing it leaves the connection open through arcpool's copy)."""
    fileno = sock if isinstance(sock, int) else sock.fileno()
    return os.dup(fileno)


class _Owned:
    """An arcpool handle this object owns, given back once: by close() (or release() for an
    Allocation), at the end of a `with` block, or when the object is collected."""

    _handle = None  # set once created: close() and __del__ after a failed __init__ do nothing
    _what = "object"
    _gone = "closed"

    @staticmethod
    def _give_back(handle):
        """Gives `handle` back: each class names its C function."""
        raise NotImplementedError

    @property
    def handle(self):
        """The C handle (None once given back)."""
        return self._handle

    def _live_handle(self):
        if self._handle is None:
            raise ValueError(f"the {self._what} was {self._gone}")
        return self._handle

    def close(self):
        """Gives the handle back (once; later calls do nothing)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            self._give_back(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Allocation(_Owned):
    """One allocation, with its claim (an owner) and a reference. deallocate() gives up the
    claim, stream-ordered; release() (or close(), or garbage collection) drops the reference."""

    _what = "allocation"
    _gone = "released"
    _give_back = staticmethod(lib.arcpool_allocation_release)

    def __init__(self, handle):
        self._handle = handle

    @property
    def ptr(self):
        """The device address of its first byte."""
        data = ctypes.c_void_p()
        check(lib.arcpool_allocation_data(self._live_handle(), ctypes.byref(data)),
              "arcpool_allocation_data")
        return data.value or 0

    @property
    def nbytes(self):
        """Its size in bytes."""
        return lib.arcpool_allocation_size(self._live_handle())

    @property
    def __cuda_array_interface__(self):
        """Its bytes as a one-dimensional uint8 array (version 3, no stream: synchronize the
        stream its work is queued on before another stream reads it)."""
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                "version": 3}

    def deallocate(self, stream=None):
        """Gives up the claim: the memory is freed after the work queued on `stream` so far,
        and, for an exported allocation, after every importer's free."""
        check(lib.arcpool_deallocate_async(self._live_handle(), _stream(stream), 0),
              "arcpool_deallocate_async")

    def release(self):
        """Drops the reference (the record goes once no one refers to it)."""
        self.close()


class SharedAllocator(_Owned):
    """An arcpool allocator of `device` whose own pool another process may import: created with
    the POSIX file-descriptor handle type (a device's default pool cannot be exported). close()
    releases it; its live allocations keep it alive until they are gone."""

    _what = "allocator"
    _give_back = staticmethod(lib.arcpool_allocator_destroy)

    def __init__(self, device=0):
        options = _Options()
        lib.arcpool_allocator_options_init(ctypes.byref(options))
        if options.struct_size != ctypes.sizeof(_Options) or options.version != _OPTIONS_VERSION:
            raise ImportError(f"arcpool.ipc: the library's allocator options ({options.struct_size}"
                              f" bytes, version {options.version}) are not the ones this module "
                              f"knows ({ctypes.sizeof(_Options)} bytes, version "
                              f"{_OPTIONS_VERSION})")
        options.device = device
        options.pool_source = _POOL_OWNED
        options.ipc_handle_types = _POSIX_FILE_DESCRIPTOR
        handle = ctypes.c_void_p()
        check(lib.arcpool_allocator_create(ctypes.byref(options), ctypes.byref(handle)),
              "arcpool_allocator_create")
        self._handle = handle

    def allocate(self, nbytes, stream=None):
        """A new Allocation of `nbytes`, usable on `stream` in stream order."""
        out = ctypes.c_void_p()
        check(lib.arcpool_allocate_async(self._live_handle(), nbytes, 0, _stream(stream), 0,
                                         ctypes.byref(out)), "arcpool_allocate_async")
        return Allocation(out)


class Exporter(_Owned):
    """Shares `allocator`'s pool with the process at the other end of `sock` (a connected AF_UNIX
    SOCK_STREAM socket in blocking mode, that is without a timeout, or its descriptor) whose
    Importer joins it: blocks until its greeting arrives. The allocations sent stay claimed
    until that process released them or exited. close() sends nothing more; claims still held
    go as the importer releases them or exits."""

    _what = "exporter"
    _give_back = staticmethod(lib.arcpool_ipc_exporter_destroy)

    def __init__(self, allocator, sock):
        fd = _socket_fd(sock)
        handle = ctypes.c_void_p()
        status = lib.arcpool_ipc_exporter_create(allocator.handle, fd, ctypes.byref(handle))
        if status != 0:
            os.close(fd)  # on failure the descriptor stays the caller's
            raise ArcpoolError(status, "arcpool_ipc_exporter_create")
        self._handle = handle

    def send(self, allocation):
        """Sends `allocation` (of this exporter's allocator): the importer's stream will wait
        for the work queued so far on every stream that may use it."""
        check(lib.arcpool_ipc_send(self._live_handle(), allocation._live_handle()),
              "arcpool_ipc_send")

    @property
    def outstanding(self):
        """Allocations sent that the importer has neither released nor outlived."""
        count = ctypes.c_size_t()
        check(lib.arcpool_ipc_exporter_outstanding(self._live_handle(), ctypes.byref(count)),
              "arcpool_ipc_exporter_outstanding")
        return count.value


class Importer(_Owned):
    """Joins the Exporter at the other end of `sock` (a socket in blocking mode, as for
    Exporter; blocks until its pool arrives), importing
    its pool for `allocator` (default: `device`'s default allocator). close() drops this handle:
    the connection and the imported pool go once every allocation received is freed."""

    _what = "importer"
    _give_back = staticmethod(lib.arcpool_ipc_importer_destroy)

    def __init__(self, sock, allocator=None, device=0):
        target = allocator.handle if allocator is not None else _lib.default_allocator(device)
        fd = _socket_fd(sock)
        handle = ctypes.c_void_p()
        status = lib.arcpool_ipc_importer_create(target, fd, ctypes.byref(handle))
        if status != 0:
            os.close(fd)
            raise ArcpoolError(status, "arcpool_ipc_importer_create")
        self._handle = handle

    def receive(self, stream=None):
        """The next allocation sent (blocks until one arrives), usable on `stream` once the
        exporter's work on it is done (the stream waits for it). ArcpoolError PEER_GONE once
        the exporter exited or closed."""
        out = ctypes.c_void_p()
        check(lib.arcpool_ipc_receive(self._live_handle(), _stream(stream), ctypes.byref(out)),
              "arcpool_ipc_receive")
        return Allocation(out)
