#!/usr/bin/env bash
# One command from a fresh checkout: install mlaunch, build the CPU trainer environment and
# the tiny model, then run configs/quickstart.yaml (LoRA, 2 local processes, no GPU).
set -euo pipefail
cd "$(dirname "$0")"
start=$(date +%s)
python -m pip install -q -e .
bash tests/env/make_trainer_venv.sh .venvs/trainer
.venvs/trainer/bin/python tests/tinymodel.py .quickstart >/dev/null
# A second quickstart starts over on purpose: its output_dir already holds checkpoints.
mlaunch submit configs/quickstart.yaml --overwrite
echo
echo "adapter: $PWD/.quickstart/output (adapter_model.safetensors)"
echo "logs:    $PWD/.quickstart/output/logs/"
echo "quickstart took $(( $(date +%s) - start ))s"
