#!/usr/bin/env bash
# Issue 14's GPU rows in one prepared run, for a machine with a CUDA GPU and a CUDA build of
# torch (a lent device machine's image has both, with pytest, safetensors and tqdm):
#   1. tests/test_cuda.py: capture, RNG replay and validation on the GPU (they skip here);
#   2. bench_capture.py --device cuda --large: trace / forward on the GPU, every timed run
#      ended by torch.cuda.synchronize(), for the benchmark models plus the GPT-2-small and
#      ResNet-50 sized ones (target: trace at most 1.5x);
#   3. bench_validate.py --device cuda: tl.validate / forward on the GPU, beside its floor.
# Each step's output goes to the terminal and to a log in OUTDIR (default: $OUT, the device
# tool's folder, else ./device_out). Exits 2 at once where no GPU is seen, else with the
# number of steps that failed (a missed benchmark target counts).
# Run: bash benchmarks/device_check.sh [OUTDIR] [REPEATS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-device_out}}
repeats=${2:-10}
python=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "device_check: torch sees no CUDA GPU here; run this on a machine with one" >&2
  exit 2
fi
mkdir -p "$out"
"$python" -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" \
  | tee "$out/device.txt"

failed=0
"$python" -m pytest tests/test_cuda.py -p no:cacheprovider 2>&1 | tee "$out/test_cuda.log" \
  || failed=$((failed + 1))
"$python" benchmarks/bench_capture.py --device cuda --large --repeats "$repeats" 2>&1 \
  | tee "$out/bench_capture_cuda.log" || failed=$((failed + 1))
"$python" benchmarks/bench_validate.py --device cuda --repeats "$repeats" 2>&1 \
  | tee "$out/bench_validate_cuda.log" || failed=$((failed + 1))
exit "$failed"
