#!/usr/bin/env bash
# GPU proof, part 1 (issue 7): `mlaunch check` on a 2-GPU machine (GPU rows, NCCL all-reduce
# bus bandwidth) against the same all-reduce program started by torchrun by hand, alternating.
# Run on the device machine from the repo root; the launcher's missing wheels are in .whl/.
# Usage: bash bench/gpu_check.sh OUTDIR [RUNS]
set -uo pipefail
OUT=${1:?outdir}; RUNS=${2:-3}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# NVLink multicast stays off on this shared host, in every program.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L | tee "$OUT/gpus.txt"
PY=$(python3 -c 'import sys; print(sys.executable)')
spec() {  # spec MB -> a check job for 2 local GPUs with a collective of MB megabytes
  cat > "$OUT/check-$1.yaml" <<YAML
name: gpu-check
cluster:
  hosts: [localhost]
  gpus_per_node: 2
  python: $PY
  env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1"}
trainer: script
script: {path: $PWD/tests/scripts/collective.py, args: [--mb, "$1", --iters, "5"]}
output_dir: /tmp/gpu-check/out
preflight: {min_free_gb: 1, min_shm_mb: 64, collective_mb: $1}
YAML
}
for mb in 64 4096; do spec $mb; done
python3 -m launcher.cli check "$OUT/check-4096.yaml" 2>&1 | tee "$OUT/check-table.txt"
for i in $(seq "$RUNS"); do
  for mb in 64 4096; do
    python3 -m launcher.cli check "$OUT/check-$mb.yaml" --json > "$OUT/check-$mb-$i.json" 2>>"$OUT/err.txt"
    "$(dirname "$PY")/torchrun" --nproc-per-node 2 tests/scripts/collective.py --mb "$mb" --iters 5 \
      2>>"$OUT/err.txt" | grep MLAUNCH-COLLECTIVE > "$OUT/hand-$mb-$i.txt"
  done
done
python3 - "$OUT" <<'PY'
import glob, json, re, statistics, sys
out = sys.argv[1]
for mb in (64, 4096):
    ours, hand = [], []
    for f in sorted(glob.glob(f"{out}/check-{mb}-*.json")):
        rows = [r for r in json.load(open(f))["results"] if r["check"] == "collective"]
        m = re.search(r"busbw ([\d.]+) GB/s", rows[0]["detail"]) if rows else None
        if m: ours.append(float(m.group(1)))
    for f in sorted(glob.glob(f"{out}/hand-{mb}-*.txt")):
        line = open(f).read().strip()
        if line: hand.append(json.loads(line.split(" ", 1)[1])["busbw_gbps"])
    if ours and hand:
        print(f"{mb} MB all-reduce busbw: mlaunch check median {statistics.median(ours):.1f} GB/s {ours}; "
              f"torchrun by hand median {statistics.median(hand):.1f} GB/s {[round(h, 1) for h in hand]}; "
              f"ratio {statistics.median(ours) / statistics.median(hand):.3f}")
    else:
        print(f"{mb} MB: missing results: ours={ours} hand={hand}")
PY
