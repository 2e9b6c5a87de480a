#!/bin/bash
# Device call 1 (one H200): ZeRO-3 settings 4 and 8 of bench/memory_proof.py, 3 alternating
# rounds with mlaunch's defaults (expandable_segments:True), then setting 4 twice with torch's
# allocator default (expandable_segments:False). Run from the repo root; results under $OUT.
export PYTHONUNBUFFERED=1
R=/tmp/r1; mkdir -p $R
nvidia-smi > $R/nvidia-smi.txt 2>&1
timeout 430 python3 bench/memory_proof.py $R/z3 --parts estimate --settings 4,8 --repeat 3 \
    --wheels .whl --steps 10 > $R/z3.log 2>&1
echo "z3 exit $?" >> $R/z3.log
timeout 125 python3 bench/memory_proof.py $R/z3off --parts estimate --settings 4 --repeat 2 \
    --wheels .whl --steps 10 --env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False > $R/z3off.log 2>&1
echo "z3off exit $?" >> $R/z3off.log
cp /tmp/memory-proof/*.yaml $R/ 2>/dev/null
tar czf $OUT/r1.tgz -C /tmp r1
tail -5 $R/z3.log $R/z3off.log | cut -c1-300
python3 bench/memory_proof.py --summarize $R/z3/results.jsonl $R/z3off/results.jsonl
