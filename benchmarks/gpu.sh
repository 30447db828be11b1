#!/usr/bin/env bash
# Everything remat measures on a CUDA GPU, in one go (about 8 minutes on one H100 with 16 cores):
#   bash benchmarks/gpu.sh [OUT_DIR]
# Four jobs run side by side on the one GPU (each its own process: the memory readings, per process,
# are exact; step times are ratios of steps run back to back within one job, so contention slows
# both sides of a ratio alike):
# 1. the CUDA tests (pinned-memory offloading, CUDA memory measurement, compiled plans on CUDA);
# 2. benchmarks/cuda_checks.py: gradient accuracy against float64, split plans, attention kernels,
#    reordering on the GPU;
# 3. benchmarks/cuda.py: the eager lowering on CUDA (peaks, gradients, overheads, pinned offloads);
# 4. benchmarks/cuda_peak_gap.py: where measured peaks leave the predictions, allocation by allocation.
# With GPU_INDUCTOR=1, then benchmarks/inductor.py --device cuda (remat+Inductor against Inductor's own
# partitioner; 15-20 minutes more). Each job stops after GPU_JOB_SECONDS (default 420).
# Raw measurements go to OUT_DIR (default: a temporary folder) as JSON and logs, so that a run cut
# short still leaves what it measured; render the tables afterwards with
#   python benchmarks/cuda.py --render OUT_DIR/cuda.json
#   python benchmarks/cuda_checks.py --render OUT_DIR/cuda_checks.json
#   python benchmarks/inductor.py --device cuda --load OUT_DIR/inductor_cuda.json
# Runs from a checkout with remat's dependencies importable (src/ is put on the path).
set -u
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
limit=${GPU_JOB_SECONDS:-420}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:${PYTHONPATH:-}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}
# Expandable segments: the caching allocator then splits cached blocks down to 512 bytes, so a tensor holds
# its own size (without them it may hold a block up to 1 MiB larger: benchmarks/cuda_peak_gap.md).
# GPU_DEFAULT_ALLOCATOR=1 keeps PyTorch's default instead.
if [ "${GPU_DEFAULT_ALLOCATOR:-0}" != 1 ]; then
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
fi
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
timeout "$limit" python3 -m pytest -q -p no:cacheprovider -n 3 --dist loadfile tests/test_offload.py \
    tests/test_measure.py tests/test_cost_profile.py tests/test_inductor.py -k "cuda or pinned" \
    > "$out/cuda_tests.log" 2>&1 &
timeout "$limit" python3 benchmarks/cuda_checks.py --save "$out/cuda_checks.json" > "$out/cuda_checks.log" 2>&1 &
timeout "$limit" python3 benchmarks/cuda.py --rounds 5 --save "$out/cuda.json" > "$out/cuda.log" 2>&1 &
timeout "$limit" python3 benchmarks/cuda_peak_gap.py --save "$out/cuda_peak_gap.json" > "$out/cuda_peak_gap.log" 2>&1 &
wait
for f in cuda_tests cuda_checks cuda cuda_peak_gap; do echo "== $f"; grep -v "^[EW][0-9]\{4\} " "$out/$f.log" | tail -4; done
if [ "${GPU_INDUCTOR:-0}" = 1 ]; then
    python3 benchmarks/inductor.py --device cuda --save "$out/inductor_cuda.json" > "$out/inductor_cuda.log" 2>&1
    tail -3 "$out/inductor_cuda.log"
fi
echo "measurements in $out"
