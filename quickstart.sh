#!/usr/bin/env bash
# One command from a fresh checkout: mlaunch in a virtualenv of its own (.venvs/mlaunch, with
# the report extra), a CPU trainer venv with only what this job needs (.venvs/quickstart:
# LLaMA-Factory, no DeepSpeed), a tiny model built on the spot, then configs/quickstart.yaml:
# LoRA, 2 local processes, no GPU, no SSH. The whole output is in .quickstart/submit.log; the
# console shows mlaunch's own lines and the loss, then a summary and what to run next.
#
# PYTHON names the base interpreter (CPython 3.11; default python3). TORCH_WHEEL_DIR is where
# the torch 2.13.0 CPU wheel lies (default /opt/wheels); nothing installs torch from PyPI.
set -euo pipefail
cd "$(dirname "$0")"
start=$(date +%s)
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p .quickstart

step() { printf 'quickstart: %s\n' "$*"; }

# mlaunch with its `report` extra (matplotlib), so that every command the README shows works
# from this venv, `mlaunch report RUN` included. The venv is kept while the stamp matches what
# it was installed from (the extra and pyproject.toml); a venv of an older quickstart.sh, or
# one from before pyproject.toml changed, gets pip install again.
MLAUNCH_PKG='.[report]'
want="$MLAUNCH_PKG $(sha256sum pyproject.toml | cut -c1-16)"
stamp=.venvs/mlaunch/.quickstart-installed
if [ ! -x .venvs/mlaunch/bin/mlaunch ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    step "installing mlaunch (with the report extra) into .venvs/mlaunch"
    [ -x .venvs/mlaunch/bin/python ] || "$PYTHON" -m venv .venvs/mlaunch
    .venvs/mlaunch/bin/python -m pip install -q -e "$MLAUNCH_PKG" > .quickstart/pip.log 2>&1 \
        || { cat .quickstart/pip.log; exit 1; }
    printf '%s\n' "$want" > "$stamp"
fi
step "the trainer venv .venvs/quickstart (built once per machine, then reused)"
bash tests/env/make_quickstart_venv.sh .venvs/quickstart > .quickstart/venv.log 2>&1 \
    || { tail -30 .quickstart/venv.log; exit 1; }
step "the tiny model and dataset in .quickstart/"
.venvs/quickstart/bin/python tests/tinymodel.py .quickstart > /dev/null

step "mlaunch submit configs/quickstart.yaml (all output: .quickstart/submit.log)"
# A second quickstart starts over on purpose: its output_dir already holds checkpoints.
set +e
.venvs/mlaunch/bin/mlaunch submit configs/quickstart.yaml --overwrite 2>&1 \
    | tee .quickstart/submit.log | grep --line-buffered -E "^\[mlaunch\]|'loss'"
rc=${PIPESTATUS[0]}
set -e
loss=$(grep -o "'loss': [0-9.]*" .quickstart/submit.log | tail -1 | cut -d' ' -f2)
echo
if [ "$rc" -ne 0 ]; then
    echo "quickstart: the job failed (exit $rc); see .quickstart/submit.log"
    exit "$rc"
fi
cat <<TXT
quickstart: done in $(( $(date +%s) - start )) s; final loss ${loss:-?}
  adapter: $PWD/.quickstart/output/adapter_model.safetensors
  logs:    $PWD/.quickstart/output/logs/

Next:
  source .venvs/mlaunch/bin/activate        # mlaunch on your PATH
  mlaunch ps --all                          # the run you just made, and its nodes
  mlaunch submit configs/quickstart.yaml --dry-run --overwrite   # what a second run would run (over
                                            # this one's checkpoints), connecting nowhere
Then copy configs/quickstart.yaml, set cluster.hosts to your machines (docs/hosts.md).
TXT
