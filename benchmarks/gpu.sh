#!/usr/bin/env bash
# Everything remat measures on a CUDA GPU, in one go (about 15-25 minutes on one H100):
#   bash benchmarks/gpu.sh [OUT_DIR]
# 1. the CUDA tests (pinned-memory offloading, CUDA memory measurement, compiled plans on CUDA);
# 2. benchmarks/cuda.py: the eager lowering on CUDA (peaks, gradients, overheads, pinned offloads);
# 3. benchmarks/inductor.py --device cuda: remat+Inductor against Inductor's own partitioner.
# Raw measurements go to OUT_DIR (default: a temporary folder) as JSON and logs, so that a run cut
# short still leaves what it measured; render the tables afterwards with
#   python benchmarks/cuda.py --render OUT_DIR/cuda.json
#   python benchmarks/inductor.py --device cuda --load OUT_DIR/inductor_cuda.json
# Runs from a checkout with remat's dependencies importable (src/ is put on the path).
set -u
cd "$(dirname "$0")/.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-$(nproc)}
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
python3 -m pytest -q -p no:cacheprovider tests/test_offload.py tests/test_measure.py tests/test_cost_profile.py \
    tests/test_inductor.py -k "cuda or pinned" 2>&1 | tee "$out/cuda_tests.log" | tail -5
python3 benchmarks/cuda.py --save "$out/cuda.json" > "$out/cuda.log" 2>&1
tail -3 "$out/cuda.log"
python3 benchmarks/inductor.py --device cuda --save "$out/inductor_cuda.json" > "$out/inductor_cuda.log" 2>&1
tail -3 "$out/inductor_cuda.log"
echo "measurements in $out"
