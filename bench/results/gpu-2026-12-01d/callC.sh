#!/bin/bash
# Device call C (one H200, a fresh machine): round 4 of the comparison of calls A and B, so that
# every hand setting has at least 3 runs.
export PYTHONUNBUFFERED=1
R=/tmp/rC; mkdir -p $R
timeout 380 python3 bench/memory_proof.py $R/choice --parts choice --hand sweep --runs 1 --first 4 \
    --wheels .whl --steps 10 > $R/choice.log 2>&1
echo "choice exit $?" >> $R/choice.log
cp $R/choice/results.jsonl $OUT/choiceC.jsonl
tar czf $OUT/rC.tgz -C /tmp rC
tail -n 3 $R/choice.log | cut -c1-300
python3 bench/memory_proof.py --summarize $R/choice/results.jsonl
