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
# 4. benchmarks/cuda_peak_gap.py: where measured peaks leave the predictions, allocation by allocation;
# 5. (not by default) benchmarks/split_lengths.py --device cuda: batches of many lengths below the LM
#    head's floor, trained through both lowerings (GPU_LENGTHS_STEPS steps, default 30).
# GPU_JOBS picks the jobs (default "tests checks cuda peak_gap"; also "lengths"), CUDA_CHECKS_SECTIONS
# the sections of job 2 (default: all).
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
jobs=${GPU_JOBS:-tests checks cuda peak_gap}
run() {  # run NAME COMMAND...: in the background, its output in $out/NAME.log, if NAME is in $jobs
    local name=$1; shift
    case " $jobs " in *" $name "*) timeout "$limit" "$@" > "$out/$name.log" 2>&1 & ;; esac
}
run tests python3 -m pytest -q -p no:cacheprovider -n 3 --dist loadfile tests/test_offload.py \
    tests/test_measure.py tests/test_cost_profile.py tests/test_inductor.py tests/test_split_cuda.py tests/test_random_cuda.py -k "cuda or pinned"
run checks python3 benchmarks/cuda_checks.py --save "$out/cuda_checks.json" ${CUDA_CHECKS_SECTIONS:+--sections $CUDA_CHECKS_SECTIONS}
run cuda python3 benchmarks/cuda.py --rounds 5 --save "$out/cuda.json"
run peak_gap python3 benchmarks/cuda_peak_gap.py --save "$out/cuda_peak_gap.json"
run lengths python3 benchmarks/split_lengths.py --device cuda --steps "${GPU_LENGTHS_STEPS:-30}" \
    --out "$out/split_lengths_cuda.md"
wait
for f in $jobs; do echo "== $f"; grep -v "^[EW][0-9]\{4\} " "$out/$f.log" | tail -4; done
if [ "${GPU_INDUCTOR:-0}" = 1 ]; then
    python3 benchmarks/inductor.py --device cuda --save "$out/inductor_cuda.json" > "$out/inductor_cuda.log" 2>&1
    tail -3 "$out/inductor_cuda.log"
fi
echo "measurements in $out"
