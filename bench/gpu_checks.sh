#!/usr/bin/env bash
# The checks of the training side that need a CUDA GPU, in one bounded run (about 7 minutes on one H200):
#
#   1. bench/trainer_step.py at Qwen3-0.6B's size (random weights, no download), bf16 autocast:
#      tokens/s, micro-batches and peak GPU memory per token budget, padded against packed.
#   2. tests/trainer/test_weight_sync.py and test_training_args.py with CUDA visible (the GPU
#      branches: fp16 allowed, CUDA tensors synchronised before a sync reads them).
#   3. tests/trainer/test_learning.py, three seeds, the trainer on the GPU (HarnessGRPOConfig leaves
#      use_cpu False when CUDA is there) and the embedded engine on the CPU: weights go GPU -> CPU.
#
# Each step has its own time limit and its log under $LOGS (default runs/gpu-checks); the run goes on
# after a failed step and exits non-zero if any failed. Needs the tiny and task models built
# ($HARNESS_GRPO_CACHE) and the project's Python dependencies importable.
#
#     bash bench/gpu_checks.sh [trainer_step] [gpu_unit_tests] [learning]    (default: all three)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
LOGS="${LOGS:-runs/gpu-checks}"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
failed=()

wanted=("${@:-trainer_step gpu_unit_tests learning}")
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  [[ " ${wanted[*]} " == *" $name "* ]] || return 0
  local start=$SECONDS
  echo "=== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$LOGS/$name.log"
  echo "=== $name: rc=$rc in $((SECONDS - start))s"
  [ "$rc" -eq 0 ] || failed+=("$name")
}

nvidia-smi -L
"$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__,
"cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'

step trainer_step 100 "$PY" bench/trainer_step.py --device cuda --model qwen3-0.6b --bf16 --rollouts 64 \
  --budgets 8192 16384 32768
step gpu_unit_tests 80 "$PY" -m pytest -q -p no:cacheprovider tests/trainer/test_weight_sync.py \
  tests/trainer/test_training_args.py \
  tests/trainer/test_trainer_api.py::test_the_trained_the_reference_and_the_served_model_use_no_hub_kernels
step learning 280 "$PY" -m pytest -q -s -p no:cacheprovider tests/trainer/test_learning.py

if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "ALL PASSED"
