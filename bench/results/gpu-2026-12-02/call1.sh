#!/bin/bash
# Device call 1 (one H200): issue 30's ZeRO-2 rows of bench/memory_proof.py, each once:
#   10  1.10 B Llama (untied, vocab 32000, GQA 32/4) full, ZeRO-2, ckpt on, micro-batch 8, cutoff 2048
#   11  the same at micro-batch 1 (backward's activations small: whether the optimizer step peaks)
#   12  0.39 B Qwen2 full, ZeRO-2, ckpt off, micro-batch 8 (row 3 is its ZeRO-0 twin)
#   13  1.54 B Qwen2 LoRA r16, ZeRO-2, ckpt off, micro-batch 4 (row 7 is its ZeRO-3 twin)
export PYTHONUNBUFFERED=1
R=/tmp/r1; mkdir -p $R
nvidia-smi > $R/nvidia-smi.txt 2>&1
timeout ${EST_S:-540} python3 bench/memory_proof.py $R/z2 --parts estimate --settings ${ROWS:-10,11,12,13} \
    --wheels .whl --steps 10 > $R/z2.log 2>&1
echo "estimate exit $?" >> $R/z2.log
for f in /tmp/memory-proof/m-*/info.json; do
  cp "$f" "$R/info-$(basename "$(dirname "$f")").json"; done
cp $R/z2/results.jsonl $OUT/z2.jsonl; cp $R/z2/ds_config-*.json $OUT/ 2>/dev/null
cp $R/nvidia-smi.txt $OUT/
tar czf $OUT/r1.tgz -C /tmp r1
tail -n 3 $R/z2.log | cut -c1-300
python3 bench/memory_proof.py --summarize $R/z2/results.jsonl
