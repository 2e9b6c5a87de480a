#!/usr/bin/env bash
# The test command: installs everything the suite needs on a fresh machine (as root on Linux),
# then runs the whole suite. Safe to run again: installed pieces are kept, venvs are rebuilt
# only when their pinned inputs changed. Extra arguments go to pytest.
#
# --fast: the inner loop. No apt, no venv build, no pip step: runs every test that needs no
# trainer run or venv, no namespace host, no Slurm cluster and starts no torchrun job
# (markers training, multihost, launches). CI runs everything (no --fast).
set -euo pipefail
cd "$(dirname "$0")"
start=$(date +%s)
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1

# Where PYTHONDONTWRITEBYTECODE is set (this machine's environment sets it), a fresh clone would
# compile the launcher from source in every mlaunch process the suite starts (the CLI, the
# supervisors, the programs on the nodes). Compiled once here; Python reads .pyc files whatever
# that variable says. Measured under load: --fast's CPU 130 s -> 106 s. Only launcher/: the
# golden files under tests/ include .py files whose folders the golden test lists.
python -m compileall -q launcher >/dev/null

if [ "${1:-}" = "--fast" ]; then
  shift
  # A test that asks for a venv without the training mark fails here (tests/training.py).
  export MLAUNCH_TESTS_FAST=1
  set +e
  python -m pytest -q -n 2 --dist loadgroup --durations=15 \
    -m "not multihost and not training and not launches" "$@"
  rc=$?
  [ "$rc" -eq 5 ] && { echo "run-tests: pytest collected no tests; failing" >&2; rc=1; }
  echo "run-tests --fast: total $(( $(date +%s) - start ))s, exit $rc"
  exit "$rc"
fi

# Test hosts are network namespaces with their own sshd; pdsh is a benchmark baseline; the
# Slurm tests run Debian's slurmctld/slurmd (22.05) with munge over those hosts; the live
# view's terminal test runs mlaunch in tmux; the container tests run Debian's podman.
need_apt=0
for bin in sshd ssh ip nft iptables pkill pdsh slurmctld slurmd sbatch munged tmux podman rsync; do
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need_apt=1
done
if [ "$need_apt" = 1 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq openssh-server openssh-client iproute2 nftables iptables procps pdsh \
      slurmctld slurmd slurm-client munge tmux podman rsync >/dev/null
  else
    echo "run-tests: not root or no apt-get: multi-host tests will be skipped" >&2
  fi
fi

# The launcher and its test tools. torch is pinned to the CPU wheel on local disk.
python -m pip install -q -e '.[test]'

# The "remote" trainer interpreters for the training tests: LLaMA-Factory and ms-swift on CPU.
bash tests/env/make_trainer_venv.sh .venvs/trainer
bash tests/env/make_swift_venv.sh .venvs/swift
# The container tests' image: Debian's python3.11 and the trainer venv's packages, imported
# into podman's storage once per machine (cached by its inputs; tests/env/make_trainer_image.sh).
if command -v podman >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  bash tests/env/make_trainer_image.sh .venvs/trainer >/dev/null
fi

echo "run-tests: setup took $(( $(date +%s) - start ))s"
set +e
# Four workers (pytest-xdist) on the 2-core machine, a test file each at a time and every
# Slurm test on one worker (loadgroup; tests/conftest.py names the groups): many tests wait
# on sshd, torchrun and timers rather than the CPU. Measured quiet (2026-12-03): -n 2 used
# the cores part of the time (47.1 min), -n 4 kept them busy (mean 1.95 cores, 22.5 min).
# Wait limits scale with the workers (tests/loadfactor.py with_workers). At the end: the 30
# slowest by wall time, then the 30 costliest by CPU (tests/cpuacct.py: each worker in a cgroup
# of its own, so a test's CPU holds its trainer ranks, sshd sessions and Slurm jobs).
python -m pytest -q -n 4 --dist loadgroup --durations=30 "$@"
rc=$?
set -e
# Exit code 5 means pytest collected no tests: that is a failure, not a pass.
if [ "$rc" -eq 5 ]; then
  echo "run-tests: pytest collected no tests; failing" >&2
  rc=1
fi
echo "run-tests: total $(( $(date +%s) - start ))s, exit $rc"
exit "$rc"
