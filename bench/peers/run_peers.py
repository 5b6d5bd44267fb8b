#!/usr/bin/env python3
"""Peer comparisons on the GPU machine (tools/device-check tier 4): arcpool against PyTorch's
native caching allocator, PyTorch's cudaMallocAsync backend, and CuPy's MemoryPool and
MemoryAsyncPool, on the same workloads. Each configuration runs in a fresh process (an allocator
is chosen before the first CUDA allocation).

Workloads:
  train        time per training step and peak reserved bytes (a small transformer-ish MLP)
  alloc        time per allocation+free of a tensor (allocation-heavy loop, mixed sizes)
  record_ahead tensors used on a side stream with record_stream while the CPU runs ahead of the
               GPU (no synchronization for many steps): peak reserved and time per step
  cupy_alloc   CuPy: time per allocation+free and the bytes the allocator holds at the end (its
               cache included; the same figure for every allocator)

Usage: run_peers.py --out peers.json   (PYTHONPATH must reach arcpool's package)
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap

TORCH_CONFIGS = {
    "torch-native": {"env": {}, "install": ""},
    "torch-cudaMallocAsync": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                              "install": ""},
    "arcpool": {"env": {}, "install": "import arcpool.torch; arcpool.torch.install()"},
}
# Each installs the allocator and defines held(): the bytes it holds now (cache included).
CUPY_CONFIGS = {
    "cupy-MemoryPool": "pool = cupy.cuda.MemoryPool(); cupy.cuda.set_allocator(pool.malloc)\n"
                       "held = pool.total_bytes",
    "cupy-MemoryAsyncPool": "pool = cupy.cuda.MemoryAsyncPool(); "
                            "cupy.cuda.set_allocator(pool.malloc)\nheld = pool.total_bytes",
    "arcpool": "import arcpool, arcpool.cupy; arcpool.cupy.install()\n"
               "held = lambda: arcpool.stats()['arcpool.bytes_held_current']",
}

TORCH_PRELUDE = """
import json, time, torch
def reserved(name):
    if name == "arcpool":
        import arcpool
        return arcpool.stats()["reserved_bytes.all.peak"]
    return torch.cuda.max_memory_reserved()
"""

WORKLOADS = {
    "train": """
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.GELU(),
                              torch.nn.Linear(8192, 2048)) for _ in range(6)]).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    x = torch.randn(64, 256, 2048, device="cuda")
    loss = model(x).float().pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(3): step()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20): step()
torch.cuda.synchronize()
result = {"ms_per_step": (time.perf_counter() - t) * 1e3 / 20}
""",
    "alloc": """
sizes = [4096 * (1 + (i * 7919) % 2048) for i in range(256)]
for s in sizes: torch.empty(s, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize(); t = time.perf_counter(); n = 0
for _ in range(40):
    for s in sizes:
        x = torch.empty(s, dtype=torch.uint8, device="cuda"); del x; n += 1
torch.cuda.synchronize()
result = {"us_per_alloc_free": (time.perf_counter() - t) * 1e6 / n}
""",
    "record_ahead": """
side = torch.cuda.Stream()
torch.cuda.synchronize(); t = time.perf_counter()
for step in range(200):
    x = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda._sleep(200_000)                # the main stream is busy
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(400_000)            # the side stream uses x for longer
        y = x[:16].clone()
    x.record_stream(side)
    del x                                     # the CPU runs on: no synchronization
torch.cuda.synchronize()
result = {"ms_per_step": (time.perf_counter() - t) * 1e3 / 200}
""",
}

CUPY_WORKLOAD = """
import json, time, cupy
sizes = [4096 * (1 + (i * 7919) % 2048) for i in range(256)]
for s in sizes: cupy.empty(s, dtype=cupy.uint8)
cupy.cuda.runtime.deviceSynchronize(); t = time.perf_counter(); n = 0
for _ in range(40):
    for s in sizes:
        x = cupy.empty(s, dtype=cupy.uint8); del x; n += 1
cupy.cuda.runtime.deviceSynchronize()
result = {"us_per_alloc_free": (time.perf_counter() - t) * 1e6 / n}
"""


def run(code, env):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, **env), timeout=300)
    if out.returncode != 0:
        return {"error": (out.stderr or out.stdout)[-800:]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = []
    for workload, body in WORKLOADS.items():
        for name, config in TORCH_CONFIGS.items():
            code = textwrap.dedent(config["install"]) + "\n" + TORCH_PRELUDE + body + (
                f"\nresult['peak_reserved_bytes'] = reserved({name!r})\nprint(json.dumps(result))")
            row = {"workload": workload, "allocator": name, **run(code, config["env"])}
            print(json.dumps(row), flush=True)
            results.append(row)
    for name, install in CUPY_CONFIGS.items():
        code = ("import cupy\n" + install + "\n" + CUPY_WORKLOAD +
                "\nresult['held_bytes_end'] = held()\nprint(json.dumps(result))")
        row = {"workload": "cupy_alloc", "allocator": name, **run(code, {})}
        print(json.dumps(row), flush=True)
        results.append(row)
    with open(args.out, "w") as f:
        json.dump({"results": results}, f, indent=1)
    failed = [r for r in results if "error" in r]
    if failed:
        print(f"{len(failed)} configurations failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
