#!/bin/bash
# Device call B (one H200): round 2 of call A's comparison, then estimate row 7 of
# bench/memory_proof.py (1.54 B LoRA r16, ZeRO-3, checkpointing off, micro-batch 4) under
# today's render (its only measurement came from the older one).
export PYTHONUNBUFFERED=1
R=/tmp/rB; mkdir -p $R
timeout ${CHOICE_S:-330} python3 bench/memory_proof.py $R/choice --parts choice --hand sweep --runs ${RUNS:-1} --first ${FIRST:-2} \
    --wheels .whl --steps 10 > $R/choice.log 2>&1
echo "choice exit $?" >> $R/choice.log
timeout ${EST_S:-150} python3 bench/memory_proof.py $R/est7 --parts estimate --settings 7 --wheels .whl \
    --steps 10 > $R/est7.log 2>&1
echo "est7 exit $?" >> $R/est7.log
cp $R/choice/results.jsonl $OUT/choiceB.jsonl; cp $R/est7/results.jsonl $OUT/est7.jsonl
tar czf $OUT/rB.tgz -C /tmp rB
tail -n 3 $R/choice.log $R/est7.log | cut -c1-300
python3 bench/memory_proof.py --summarize $R/choice/results.jsonl $R/est7/results.jsonl
