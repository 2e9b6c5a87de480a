#!/bin/bash
# Device call A (one H200): issue 15's choice comparison at global batch 64 (0.39 B LoRA r16,
# cutoff 1024, bf16, 10 steps): mlaunch's pick, LLaMA-Factory's habits (8 × 8, checkpointing on;
# also under torch's allocator default) and every hand-sweep setting, alternating, rounds 0-1.
export PYTHONUNBUFFERED=1
R=/tmp/rA; mkdir -p $R
nvidia-smi > $R/nvidia-smi.txt 2>&1
timeout 520 python3 bench/memory_proof.py $R/choice --parts choice --hand sweep --runs 2 \
    --wheels .whl --steps 10 > $R/choice.log 2>&1
echo "choice exit $?" >> $R/choice.log
cp $R/choice/results.jsonl $OUT/choiceA.jsonl
tar czf $OUT/rA.tgz -C /tmp rA
tail -n 3 $R/choice.log | cut -c1-300
python3 bench/memory_proof.py --summarize $R/choice/results.jsonl
