#!/bin/bash
# Device call 2 (one H200): setting 9 of bench/memory_proof.py (1.5 B full, ZeRO-0), the
# LLaMA-Factory launch environment (bench/lf_env.py), one FSDP run (bench/fsdp_run.py), and
# nvidia-smi's output while a job trains (tests/data/nvidia-smi-h200*.csv). Results under $OUT.
export PYTHONUNBUFFERED=1
R=/tmp/r2; mkdir -p $R
(sleep 60; timeout 45 nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total \
    --format=csv,noheader,nounits -lms 500 > $OUT/nvidia-smi-h200.csv) &
(sleep 80; nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv \
    > $OUT/nvidia-smi-h200-header.csv) &
timeout 170 python3 bench/memory_proof.py $R/est9 --parts estimate --settings 9 --wheels .whl \
    --steps 10 > $R/est9.log 2>&1
echo "est9 exit $?" >> $R/est9.log
timeout 230 python3 bench/lf_env.py $R/lfenv --gpus 1 --runs 3 --steps 40 --per-device 32 \
    --wheels .whl > $R/lfenv.log 2>&1
echo "lfenv exit $?" >> $R/lfenv.log
timeout 110 python3 bench/fsdp_run.py $R/fsdp --torchrun auto,always --finetuning lora --steps 30 \
    --wheels .whl > $R/fsdp.log 2>&1
echo "fsdp exit $?" >> $R/fsdp.log
wait
tar czf $OUT/r2.tgz -C /tmp r2
for f in $R/est9.log $R/lfenv.log $R/fsdp.log; do tail -n 6 $f | cut -c1-400; done
