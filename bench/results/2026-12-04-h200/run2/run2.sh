#!/usr/bin/env bash
# Second device run of 2026-12-04 (device time left: about 400 s): what run 1 (tools/device-check)
# could not finish or show. Phase 1 runs three groups side by side (correctness only), phase 2
# the timings alone. Every step has its own timeout; the whole stays under 300 s.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
B=$ROOT/build-gpu
OUT=${OUT:-$ROOT/device-out}
mkdir -p "$OUT"
L=$(mktemp -d)
export LD_LIBRARY_PATH=$B/src:$B/lib:$B/python/arcpool/lib:${LD_LIBRARY_PATH:-}
export ARCPOOL_REQUIRE_GPU=1 PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
T0=$SECONDS
step() {  # NAME LIMIT COMMAND...
  local name=$1 limit=$2 t=$SECONDS
  shift 2
  timeout -k 5 "$limit" "$@" >"$L/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t)) $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^Ran |^OK|^FAILED|ERROR SUMMARY|arcpool-stress: (ok|FAILED)' "$L/$name.log" | tail -n 3 | tr '\n' ';')" >>"$L/rc.txt"
}
nvidia-smi >"$L/nvidia-smi.log" 2>&1
echo "build: $(cat "$B/BUILD_COMMIT" 2>/dev/null)" >"$L/rc.txt"

# --- Phase 1: correctness, three groups at once ---------------------------------------------
(
  step conformance 30 "$B/tests/conformance/arcpool_cuda_conformance"
  step model-cuda 105 "$B/tests/arcpool_model_tests" \
    --gtest_filter='-*/host:*/deterministic*'
) &
(
  rmm_dir=$(mktemp -d)
  for wheel in "$ROOT"/device-in/rmm-wheels/*.whl; do python3 -m zipfile -e "$wheel" "$rmm_dir"; done
  cd "$ROOT/tests/python" || exit 1
  export PYTHONPATH=$B/python:$rmm_dir
  step py-torch 45 python3 -m unittest -v test_torch
  step py-cupy 25 python3 -m unittest -v test_cupy
  step py-arcpool 15 python3 -m unittest -v test_arcpool
  step py-torch-memory-api 25 python3 -m unittest -v test_torch_memory_api
  step py-rmm 25 python3 -m unittest -v test_rmm
) &
(
  S=$B/tools/arcpool-stress
  step memcheck 55 compute-sanitizer --tool memcheck --track-stream-ordered-races all \
    --error-exitcode 3 --print-limit 20 "$S" --driver cuda --seconds 8 --threads 2 \
    --streams 4 --max-bytes 1048576 --seed 11 --no-cache
  step memcheck-graphs 55 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
    "$S" --driver cuda --seconds 8 --threads 2 --streams 4 --max-bytes 1048576 --seed 23 --graphs
  step stress-graphs 25 "$S" --driver cuda --seconds 15 --threads 4 --streams 6 --graphs --seed 23
) &
wait
echo "phase 1 done at $((SECONDS - T0)) s" >>"$L/rc.txt"

# --- Phase 2: timings, one at a time --------------------------------------------------------
for b in same_stream cross_stream transfer; do
  step "bench-$b" 30 "$B/bench/arcpool_bench_$b" --benchmark_min_time=0.05 \
    --benchmark_out="$OUT/bench_$b.json" --benchmark_out_format=json
done
left=$((290 - (SECONDS - T0)))
if [ "$left" -gt 30 ]; then
  step peers "$left" env PYTHONPATH="$B/python" python3 "$ROOT/bench/peers/run_peers.py" \
    --out "$OUT/peers.json"
else
  echo "peers not run: $left s left" >>"$L/rc.txt"
fi
echo "all done at $((SECONDS - T0)) s" >>"$L/rc.txt"
cp "$L/rc.txt" "$OUT/rc.txt"
tar -czf "$OUT/logs.tar.gz" -C "$L" .
cat "$L/rc.txt"
