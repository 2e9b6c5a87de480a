#!/usr/bin/env bash
# GPU proof, part 2 (issue 7): LoRA through `mlaunch submit` (localhost executor, 2 GPUs) and
# the same rendered YAML through torchrun by hand, alternating; then ZeRO-3 full fine-tuning.
# Run on the device machine from the repo root. Usage: bash bench/gpu_train.sh OUTDIR [RUNS]
set -uo pipefail
OUT=${1:?outdir}; RUNS=${2:-3}; STEPS=${STEPS:-60}; W=/tmp/gpu-train
mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 DISABLE_VERSION_CHECK=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=$(python3 -c 'import sys; print(sys.executable)'); BIN=$(dirname "$PY")
python3 bench/gpu_model.py "$W/m" > "$OUT/model.json" 2>"$OUT/model.err" || { tail -20 "$OUT/model.err"; exit 1; }
spec() {  # spec NAME STEPS FINETUNING DEEPSPEED
  cat > "$W/$1.yaml" <<YAML
name: $1
cluster:
  hosts: [localhost]
  gpus_per_node: 2
  python: $PY
  env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1", DISABLE_VERSION_CHECK: "1"}
trainer: llamafactory
model: $W/m/model
template: qwen
dataset: tiny_alpaca
dataset_dir: $W/m/data
cutoff_len: 1024
finetuning: $3
batch: {per_device: 8, grad_accum: 1}
precision: bf16
$4
training: {learning_rate: 1.0e-4, max_steps: $2, save_steps: 1000, logging_steps: 10, lr_scheduler: constant, gradient_checkpointing: false}
output_dir: $W/out-$1
preflight: {min_free_gb: 1, min_shm_mb: 64}
YAML
}
spec lora "$STEPS" "{type: lora, lora_rank: 16, lora_target: all}" ""
spec z3 30 "{type: full}" "deepspeed: {stage: 3}"
python3 -m launcher.cli render "$W/lora.yaml" --out "$W/hand" --run-id hand > /dev/null
sps() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['train_samples_per_second'])" "$1/all_results.json" 2>/dev/null || echo nan; }
for i in $(seq "$RUNS"); do
  rm -rf "$W/out-lora"; t0=$(date +%s.%N)
  python3 -m launcher.cli submit "$W/lora.yaml" > "$OUT/mlaunch-$i.log" 2>&1; rc=$?
  echo "mlaunch run $i rc=$rc wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))") samples/s=$(sps "$W/out-lora")" | tee -a "$OUT/summary.txt"
  rm -rf "$W/out-lora"; t0=$(date +%s.%N)
  "$BIN/torchrun" --nproc-per-node 2 -m llamafactory.launcher "$W/hand/llamafactory.yaml" > "$OUT/hand-$i.log" 2>&1; rc=$?
  echo "by-hand run $i rc=$rc wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))") samples/s=$(sps "$W/out-lora")" | tee -a "$OUT/summary.txt"
done
[ -n "${SKIP_ZERO3:-}" ] && exit 0
t0=$(date +%s.%N)
python3 -m launcher.cli submit "$W/z3.yaml" > "$OUT/zero3.log" 2>&1; rc=$?
echo "zero3 full rc=$rc wall=$(python3 -c "import time; print(round(time.time() - $t0, 1))") samples/s=$(sps "$W/out-z3")" | tee -a "$OUT/summary.txt"
cp "$W/hand/ds_config.json" "$OUT/" 2>/dev/null; python3 -m launcher.cli render "$W/z3.yaml" --out "$OUT/z3-rendered" >/dev/null
grep -h "Error\|error:" "$OUT"/*.log | sort | uniq -c | sort -rn | head -10
