"""arcpool as PyTorch's CUDA allocator, through torch.cuda.memory.CUDAPluggableAllocator.

    import arcpool.torch
    arcpool.torch.install()      # before the first CUDA tensor
    ...
    arcpool.torch.stats()        # PyTorch cannot see a pluggable allocator's statistics
    arcpool.torch.memory_allocated()           # torch.cuda's memory functions, from arcpool
    arcpool.torch.patch_memory_api()           # or make torch.cuda's own answer from arcpool

torch.cuda.memory_allocated, memory_stats and the rest raise with a pluggable allocator (they
read the native caching allocator's statistics). arcpool.torch has the same functions, with the
same signatures, answering from the device's arcpool allocator; patch_memory_api() puts them in
place of torch.cuda's (and torch.cuda.memory's), unpatch_memory_api() restores torch's. The
figures: memory_allocated is the bytes of live allocations (requested sizes), memory_reserved
the bytes the CUDA pool reserves from the device (cudaMemPoolAttrReservedMemCurrent, as torch's
own cudaMallocAsync backend reports it); peaks may miss a rise shorter than arcpool's per-thread
batch (1 MiB; see arcpool_stats_t), or read up to that batch per thread above the true peak when
memory allocated on one thread is freed on another (autograd's thread, say).

install() wires every hook PyTorch accepts as a C function pointer: alloc / free (the free
receives the allocation stream), record_stream (Tensor.record_stream becomes an arcpool use
record: without it record_stream would silently do nothing), empty_cache and memory fraction
(a hard limit enforced by arcpool's counter). Each device's allocator is created on its first
allocation.

CUDA graphs (torch.cuda.graph, make_graphed_callables): install() also sets PyTorch's three
graph-pool hooks (begin/end allocate-to-pool, release-pool; their parameters are C++ types, so
the shim defines them in C++) and wraps torch.cuda.CUDAGraph's capture_begin and capture_end so
that the capture stream is registered with arcpool for the capture (arcpool acts on a capturing
stream only if it created or registered it). Each of PyTorch's private pools is then an arcpool
graph pool: memory reserved outside the capture, lent only to the captures bound to it, given
back once its graphs are reset (docs/graphs.md, "PyTorch's graph pools"). An allocation on
another stream that captures (a stream forked inside the capture, a capture begun with CUDA
directly) raises RuntimeError with arcpool's UNSUPPORTED message, never an out-of-memory. Not
yet run with PyTorch on a GPU: the hooks ran on simcuda only (tests/torch_shim_test.cpp).
torch.compile(mode="reduce-overhead") is unsupported: its cudagraph trees need allocator
checkpoints that pluggable allocators lack.

Limits of any pluggable allocator, from PyTorch's CUDAPluggableAllocator (not yet run on a GPU
with arcpool):
- arcpool's out-of-memory reaches Python as RuntimeError with arcpool's message, not
  torch.cuda.OutOfMemoryError: PyTorch turns only c10::OutOfMemoryError into that type, and the
  shim does not link libtorch. Code that catches OutOfMemoryError to back off will not see it,
  PyTorch's own included: its cuDNN v8 convolutions (Conv_v8.cpp) halve the workspace or try
  the next engine on c10::OutOfMemoryError, and near the memory limit fail instead.
- Peer access: PyTorch enables it with cudaDeviceEnablePeerAccess, and "cudaMallocAsync pools
  are unaffected by cudaDeviceEnablePeerAccess" (PyTorch's PeerToPeerAccess.cpp; its own
  cudaMallocAsync backend calls cudaMemPoolSetAccess). The per-device allocators install()
  creates grant no peer access unless ARCPOOL_PEER_ACCESS=1 is set before their first
  allocation; without it a kernel on one GPU that reads another GPU's tensor directly (a peer
  copy PyTorch does in a kernel) would fault.
- Tensor.record_stream with a stream of another device raises RuntimeError: arcpool refuses
  streams of other devices (docs/design.md, "Devices and contexts"); PyTorch's caching
  allocator accepts them.
- torch.backends.cudnn.benchmark = True makes convolutions ask the allocator for its largest
  cached block (cacheInfo), which CUDAPluggableAllocator refuses with "does not yet support
  cacheInfo"; keep benchmark mode off.
"""
import collections
import ctypes
import os
import pickle
import threading

from . import _lib

_installed = None


def _function_pointer(library, name):
    return ctypes.cast(getattr(library, name), ctypes.c_void_p).value


def _shim_path():
    """The shim's path for torch's dlopen: the first file found, else the bare name when the
    system's search path has it (a bare name is not a file in the working directory)."""
    for candidate in _lib._candidates("libarcpool_torch.so"):
        if os.path.sep in candidate:
            if os.path.exists(candidate):
                return candidate
            continue
        try:
            ctypes.CDLL(candidate)  # searched as torch's dlopen will search it
        except OSError:
            continue
        return candidate
    raise ImportError("arcpool: libarcpool_torch.so not found (build arcpool's python "
                      "target, or set ARCPOOL_LIBRARY_DIR)")


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
    missing = [setter for setter in _GRAPH_HOOKS if not hasattr(native, setter)]
    if missing:
        raise RuntimeError(f"arcpool: this PyTorch ({torch.__version__}) lacks the pluggable "
                           f"allocator's graph-pool setters {missing}; refusing to install "
                           f"(CUDA graph capture would allocate outside its pools)")
    for setter, function in hooks.items():
        set_hook = getattr(native, setter, None)
        if set_hook is None:
            if setter == "set_record_stream_fn":
                raise RuntimeError("arcpool: this PyTorch cannot set a record_stream hook; "
                                   "refusing to install (record_stream would do nothing)")
            continue
        set_hook(_function_pointer(shim, function))
    for setter, function in _GRAPH_HOOKS.items():
        getattr(native, setter)(_function_pointer(shim, function))
    torch.cuda.memory.change_current_allocator(allocator)
    _register_capture_streams(torch, shim)
    _installed = (allocator, shim)
    return _installed


_UNSUPPORTED = 6  # ARCPOOL_STATUS_UNSUPPORTED (arcpool.h)

# PyTorch's graph-pool setters (torch 2.11: torch._C._CUDAPluggableAllocator) and the shim's
# C++ functions of the matching types (python/arcpool_torch.cpp).
_GRAPH_HOOKS = {
    "set_begin_allocate_to_pool": "arcpool_torch_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "arcpool_torch_end_allocate_to_pool",
    "set_release_pool": "arcpool_torch_release_pool",
}


def _register_capture_streams(torch, shim):
    """Wraps torch.cuda.CUDAGraph.capture_begin and capture_end (torch.cuda.graph calls them,
    with the capture stream current): the stream is registered with the device's arcpool
    allocator from just before the capture begins until just after it ends."""
    graph = torch.cuda.CUDAGraph
    if getattr(graph.capture_begin, "_arcpool_wrapped", False):
        return
    for name in ("arcpool_torch_capture_stream_begin", "arcpool_torch_capture_stream_end"):
        getattr(shim, name).argtypes = [ctypes.c_int, ctypes.c_void_p]
        getattr(shim, name).restype = ctypes.c_int
    begin, end = graph.capture_begin, graph.capture_end
    registered = {}  # id(graph) -> (device, stream), from capture_begin until capture_end

    def capture_begin(self, *args, **kwargs):
        device = torch.cuda.current_device()
        stream = torch.cuda.current_stream(device).cuda_stream
        if not stream:  # the default stream: PyTorch refuses to capture it, in its own words
            return begin(self, *args, **kwargs)
        _lib.check(shim.arcpool_torch_capture_stream_begin(device, stream),
                   "registering the capture stream")
        try:
            begin(self, *args, **kwargs)
        except BaseException:
            # A capture PyTorch began before it failed goes on: the registration is withdrawn
            # at its capture_end, as after a refused capture_end.
            if shim.arcpool_torch_capture_stream_end(device, stream) == _UNSUPPORTED:
                registered[id(self)] = (device, stream)
            raise
        registered[id(self)] = (device, stream)  # a pybind object may take no attributes

    def capture_end(self):
        device, stream = registered.pop(id(self), (None, None))
        try:
            end(self)
        except BaseException:
            # PyTorch's error first. A capture PyTorch did not end (capture_end from another
            # stream than the capture's) goes on: arcpool refuses to withdraw the registration
            # while the stream captures (UNSUPPORTED), and the next capture_end withdraws it.
            if (stream is not None and shim.arcpool_torch_capture_stream_end(device, stream)
                    == _UNSUPPORTED):
                registered[id(self)] = (device, stream)
            raise
        if stream is not None:
            _lib.check(shim.arcpool_torch_capture_stream_end(device, stream),
                       "unregistering the capture stream")

    capture_begin._arcpool_wrapped = True
    graph.capture_begin, graph.capture_end = capture_begin, capture_end


def stats(device=0):
    """arcpool's statistics with torch.cuda.memory_stats()-style keys (see arcpool.stats)."""
    from . import stats as arcpool_stats

    return arcpool_stats(device)


def _device_index(device):
    """torch.cuda's device argument (None: the current device; an int, "cuda:N", a
    torch.device or a torch.cuda.device) as an index. None is device 0 where torch or CUDA is not available. A device
    this process does not have raises, as torch's own statistics do ("Invalid device argument"):
    arcpool would read zeros for it (no allocator)."""
    index = _device_argument(device)
    try:
        import torch
    except ImportError:
        return index
    count = torch.cuda.device_count()  # creates no context
    if count > 0 and not 0 <= index < count:
        raise RuntimeError(f"Invalid device argument {index}: this process has {count} CUDA "
                           f"device(s)")
    return index


def _device_argument(device):
    """_device_index without the check against the device count."""
    if device is None:
        try:
            import torch
        except ImportError:
            return 0
        # Before torch starts CUDA its current device is 0, and asking would start it: install()
        # would then be refused, and a process that forks CUDA workers would have a context.
        # torch's own memory functions do not start CUDA either.
        if not torch.cuda.is_initialized():
            return 0
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda":
            raise ValueError(f"arcpool: {device!r} is not a CUDA device")
        return int(index) if index else _device_argument(None)
    if not hasattr(device, "type") and isinstance(getattr(device, "idx", None), int):
        # A torch.cuda.device (torch.cuda.device_of's too), as torch.cuda's _get_device_index
        # reads it: -1 is the no-op device(-1), the current device.
        return _device_argument(None) if device.idx < 0 else device.idx
    index = getattr(device, "index", None)  # torch.device
    if getattr(device, "type", "cuda") != "cuda":
        raise ValueError(f"arcpool: {device!r} is not a CUDA device")
    return _device_argument(None) if index is None else index


# The accumulated counts torch's reset_accumulated_memory_stats restarts, among torch's keys.
_ACCUMULATED_KEYS = ("allocation.all.allocated", "allocation.all.freed", "num_alloc_retries",
                     "num_ooms")
# device -> (its default allocator's address, {key: its count at the last
# reset_accumulated_memory_stats}): a replaced allocator counts from 0 again, without the base.
_accumulated_base = {}
_accumulated_lock = threading.Lock()  # guards a check-and-drop of a base in _accumulated_base


def memory_stats(device=None):
    """torch.cuda.memory_stats(device), from arcpool: torch's keys where they mean the same
    (allocated_bytes, requested_bytes, reserved_bytes, allocation, num_alloc_retries, num_ooms)
    and every arcpool figure as "arcpool.<name>", sorted by key as torch sorts them. torch's
    accumulated counts start from the last reset_accumulated_memory_stats."""
    from . import stats as arcpool_stats

    index = _device_index(device)
    figures = arcpool_stats(index)
    entry = _accumulated_base.get(index)
    if entry is not None:
        allocator, base = entry
        # A replaced allocator counts from 0: its base goes once it is seen gone, or below the
        # base (a new allocator may be made at the freed one's address; one seen only after
        # it counted past the base is not told apart).
        if allocator != _allocator_value(index) or any(figures[k] < c for k, c in base.items()):
            # Only this base: another thread may have dropped it, or reset a newer one, since.
            with _accumulated_lock:
                if _accumulated_base.get(index) is entry:
                    del _accumulated_base[index]
        else:
            for key, count in base.items():
                figures[key] -= count
    return collections.OrderedDict(sorted(figures.items()))


def _allocator_value(index):
    """The address of `index`'s default allocator, or None while it has none."""
    handle = _lib.existing_allocator(index)
    return None if handle is None else handle.value


def reset_accumulated_memory_stats(device=None):
    """torch.cuda.reset_accumulated_memory_stats(device): torch's accumulated counts
    (allocation.all.allocated and .freed, num_alloc_retries, num_ooms) restart at 0 in
    memory_stats; arcpool's own figures ("arcpool.<name>") keep counting."""
    from . import stats as arcpool_stats

    index = _device_index(device)
    figures = arcpool_stats(index)
    with _accumulated_lock:
        _accumulated_base[index] = (_allocator_value(index),
                                    {key: figures[key] for key in _ACCUMULATED_KEYS})


def get_per_process_memory_fraction(device=None):
    """torch.cuda.get_per_process_memory_fraction(device): the fraction
    torch.cuda.set_per_process_memory_fraction last gave the device through arcpool's shim
    (1.0 before, as PyTorch's own allocator answers)."""
    shim = ctypes.CDLL(_shim_path(), mode=ctypes.RTLD_GLOBAL)
    shim.arcpool_torch_memory_fraction.argtypes = [ctypes.c_int]
    shim.arcpool_torch_memory_fraction.restype = ctypes.c_double
    return shim.arcpool_torch_memory_fraction(_device_index(device))


def memory_allocated(device=None):
    """torch.cuda.memory_allocated(device): bytes of live allocations."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    """torch.cuda.max_memory_allocated(device): the peak of memory_allocated since the start or
    the last reset_peak_memory_stats."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    """torch.cuda.memory_reserved(device): bytes the CUDA pool reserves from the device."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    """torch.cuda.max_memory_reserved(device): the peak of memory_reserved."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """torch.cuda.reset_peak_memory_stats(device): every peak restarts at its current value."""
    from . import reset_peak_stats

    reset_peak_stats(_device_index(device))


_SUMMARY_ROWS = (  # (label, key of the current figure, key of its peak, in bytes)
    ("Allocated memory", "allocated_bytes.all.current", "allocated_bytes.all.peak", True),
    ("Requested memory", "requested_bytes.all.current", "requested_bytes.all.peak", True),
    ("GPU reserved memory", "reserved_bytes.all.current", "reserved_bytes.all.peak", True),
    ("Cached by arcpool", "arcpool.bytes_cached_current", "arcpool.bytes_cached_peak", True),
    ("Pending free", "arcpool.bytes_pending_free_current", "arcpool.bytes_pending_free_peak",
     True),
    ("Allocations", "allocation.all.current", "allocation.all.peak", False),
)
_SUMMARY_COUNTS = (("Cache hits", "arcpool.cache_hits"),
                   ("Out-of-memory retries", "num_alloc_retries"),
                   ("Out-of-memory failures", "num_ooms"),
                   ("Cross-stream frees", "arcpool.cross_stream_frees"),
                   ("Deferred frees", "arcpool.deferred_frees"))


def _format_size(n):
    """Bytes as torch's summary shows them: B below 1 KiB, then KiB, MiB, GiB (rounded down)."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n} {unit}"
        n //= 1024
    return f"{n} GiB"


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary(device, abbreviated), from arcpool: a table of the figures
    memory_stats has (torch's own summary reads keys of the native caching allocator, such as
    large_pool and inactive_split, which no other allocator has). `abbreviated` is accepted and
    changes nothing: the table is short."""
    del abbreviated
    index = _device_index(device)
    stats = memory_stats(index)

    def row(label, current, peak=""):
        return f"| {label:<27}| {current:>14} | {peak:>14} |"

    rule = "|" + "-" * 62 + "|"
    lines = ["|" + "=" * 62 + "|",
             "|" + f"arcpool memory summary, device ID {index}".center(62) + "|",
             rule, row("Metric", "Cur Usage", "Peak Usage"), rule]
    for label, current, peak, in_bytes in _SUMMARY_ROWS:
        show = _format_size if in_bytes else str
        lines.append(row(label, show(stats[current]), show(stats[peak])))
    lines.append(rule)
    lines.extend(row(label, str(stats[key])) for label, key in _SUMMARY_COUNTS)
    lines.append("|" + "=" * 62 + "|")
    return "\n".join(lines) + "\n"


_MAX_DEVICES = 64  # the devices whose default allocators a snapshot looks for


def _snapshot(device=None, augment_with_fx_traces=False):
    """torch.cuda.memory._snapshot(), from arcpool's memory history: PyTorch's dictionary over
    every device, as torch's own (which ignores `device`): the "segments" of every device with
    a default allocator that keeps a history, and its "device_traces" at its index
    (arcpool.memory_snapshot; ARCPOOL_HISTORY=N turns the history on; ArcpoolError when no
    device keeps one). arcpool records no stack frames, so FX augmentation has nothing to
    add."""
    from . import memory_snapshot
    from ._lib import ArcpoolError

    del device, augment_with_fx_traces
    merged = {"segments": [], "device_traces": []}
    failure = None
    for index in range(_MAX_DEVICES):
        if _lib.existing_allocator(index) is None:
            continue
        try:
            one = memory_snapshot(index)
        except ArcpoolError as e:
            if e.status != "ARCPOOL_STATUS_UNSUPPORTED":
                raise  # a snapshot that failed (no host memory for it, say) is not left out
            failure = failure or e  # this device's allocator keeps no history: skipped
            continue
        merged["segments"].extend(one["segments"])
        traces = merged["device_traces"]
        traces.extend([] for _ in range(index + 1 - len(traces)))
        traces[index] = one["device_traces"][index]
    if failure is not None and not merged["device_traces"]:
        raise failure  # no device keeps a history: say how to turn it on
    return merged


def _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False):
    """torch.cuda.memory._dump_snapshot(filename), from arcpool: _snapshot() pickled, as
    torch's, for https://pytorch.org/memory_viz and torch/cuda/_memory_viz.py."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(augment_with_fx_traces=augment_with_fx_traces), f)


_MEMORY_API = ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
               "max_memory_reserved", "reset_peak_memory_stats", "memory_summary")
# Patched where this torch has them (both raise with a pluggable allocator, newer torches only).
_LATER_API = ("reset_accumulated_memory_stats", "get_per_process_memory_fraction")
_SNAPSHOT_API = ("_snapshot", "_dump_snapshot")  # torch.cuda.memory's only
# torch.accelerator's (and torch.accelerator.memory's), where that torch has them: they read the
# current allocator's device statistics, which a pluggable allocator refuses.
_ACCELERATOR_API = ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                    "max_memory_reserved", "reset_peak_memory_stats",
                    "reset_accumulated_memory_stats")
_patched = {}


def patch_memory_api(cuda=None, accelerator=None):
    """Makes torch.cuda's memory_stats, memory_allocated, max_memory_allocated,
    memory_reserved, max_memory_reserved, reset_peak_memory_stats and memory_summary (torch's
    own raises KeyError on another allocator's statistics) answer from arcpool, in
    torch.cuda and in torch.cuda.memory (whose own functions call one another there), and
    torch.cuda.memory's _snapshot and _dump_snapshot too; reset_accumulated_memory_stats and
    get_per_process_memory_fraction where this torch has them; and the same functions of
    torch.accelerator and torch.accelerator.memory, those that this torch has. `cuda` is
    torch.cuda and `accelerator` torch.accelerator unless `cuda` is given. Idempotent;
    unpatch_memory_api() restores torch's."""
    if cuda is None:
        import torch

        cuda = torch.cuda
        accelerator = getattr(torch, "accelerator", None)
    ours = globals()
    targets = [(cuda, _MEMORY_API), (cuda.memory, _MEMORY_API + _SNAPSHOT_API)]
    for namespace in (cuda, cuda.memory):
        targets.append((namespace, [n for n in _LATER_API if hasattr(namespace, n)]))
    if accelerator is not None:  # an older torch has fewer of these, or none
        for namespace in (accelerator, getattr(accelerator, "memory", None)):
            if namespace is not None:
                targets.append((namespace, [n for n in _ACCELERATOR_API if hasattr(namespace, n)]))
    for namespace, names in targets:
        for name in names:
            current = getattr(namespace, name)
            if current is ours[name]:
                continue
            _patched[(id(namespace), name)] = (namespace, current)
            setattr(namespace, name, ours[name])


def unpatch_memory_api():
    """Puts back the functions patch_memory_api() replaced."""
    for (_, name), (namespace, original) in _patched.items():
        setattr(namespace, name, original)
    _patched.clear()
