# mlaunch run GOLDEN: node 1 of 2 on 10.0.0.2
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_SOCKET_IFNAME=eth0
export MLAUNCH_RUN_ID=GOLDEN
export MLAUNCH_NODE_RANK=1
export MLAUNCH_NODE_ID=GOLDEN.node1
export PATH=/opt/venvs/swift/bin:"$PATH"
mkdir -p -- /data/work || exit 96
# <workdir>/.mlaunch is the team's (1777 and sticky: each user's directory in it is safe from
# the others); one that is a link is refused, one of another user's is used as it is, and this
# user's own is opened to the team (older mlaunch made it 0700, which shut the others out).
s=/data/work/.mlaunch
mkdir -m 1777 -- "$s" 2>/dev/null
[ -L "$s" ] && { echo "mlaunch: $s on $(hostname) is a link (to $(readlink -- "$s")); remove it, or set cluster.workdir to another directory" >&2; exit 96; }
[ -d "$s" ] || { echo "mlaunch: cannot create $s on $(hostname)" >&2; exit 96; }
[ -O "$s" ] && ! [ -k "$s" ] && { chmod 1777 -- "$s" || exit 96; }
# The run's directories are this user's and 0700 (pidfiles, rank logs): one that is a link or
# belongs to another user is refused before anything is made in it or changed (mkdir makes no
# directory through a link; the tests after it are on the name itself, so the chmod acts on
# this user's directory, never on a link's target). The shell's own tests, a program only to
# make a missing one and one chmod for all: every node runs this in each session, and each
# program started costs CPU there.
for d in /data/work/.mlaunch/root /data/work/.mlaunch/root/GOLDEN; do
  [ -d "$d" ] || mkdir -m 700 -- "$d" 2>/dev/null
  [ -L "$d" ] && { echo "mlaunch: $d on $(hostname) is a link (to $(readlink -- "$d")), not a directory of $(id -un)'s; remove it, or set cluster.workdir to a directory of yours" >&2; exit 96; }
  [ -d "$d" ] || { echo "mlaunch: cannot create $d on $(hostname) (in a directory of $(stat -c %U -- "${d%/*}")'s)" >&2; exit 96; }
  [ -O "$d" ] || { echo "mlaunch: $d on $(hostname) belongs to $(stat -c %U -- "$d") (uid $(stat -c %u -- "$d")), not to $(id -un) (uid $(id -u)); remove it as its owner, or set cluster.workdir to a directory of yours" >&2; exit 96; }
done
chmod 700 -- /data/work/.mlaunch/root /data/work/.mlaunch/root/GOLDEN || exit 96
cd /data/work || exit 96
echo $$ > /data/work/.mlaunch/root/GOLDEN/node1.pid
# Hang-up guard: the launcher holds this session's stdin open and sends a heartbeat byte
# every few seconds. When stdin closes (Ctrl-C, crash, dropped session) or stays silent for
# 30s (a network partition the kernel has not noticed), every process of this
# node is ended: SIGTERM, a grace period, then SIGKILL. The job reads nothing from stdin.
hangup='# mlaunch teardown of MLAUNCH_NODE_ID=GOLDEN.node1 on this host: only this user'"'"'s processes whose environment
# holds exactly that entry (a fixed string, the whole entry: never a pattern, never a prefix).
match=MLAUNCH_NODE_ID=GOLDEN.node1
job_pids() {
  for f in $(grep -lzxF -e "$match" /proc/[0-9]*/environ 2>/dev/null); do
    d=${f%/environ}; [ -O "$d" ] && [ "${d#/proc/}" != "$$" ] && echo "${d#/proc/}"
  done
}
# The live view'"'"'s sampler (templates/sampler.sh.j2) holds nothing to save, and nvidia-smi in it
# can take a long while to end on a SIGTERM: its session is KILLed first.
s=$(cat /data/work/.mlaunch/root/GOLDEN/node1.pid.sampler 2>/dev/null)
if [ -n "$s" ] && [ -O "/proc/$s" ] && grep -qzxF -e "$match" "/proc/$s/environ" 2>/dev/null; then
  kill -s KILL -- "-$s" 2>/dev/null
fi
leader=$(cat /data/work/.mlaunch/root/GOLDEN/node1.pid 2>/dev/null)
# Signal the group only while its leader is still ours: a stale pid may have been reused.
if [ -n "$leader" ] && [ -O "/proc/$leader" ] && grep -qzxF -e "$match" "/proc/$leader/environ" 2>/dev/null; then
  kill -s TERM -- "-$leader" 2>/dev/null
fi
p=$(job_pids); [ -n "$p" ] && kill -TERM $p 2>/dev/null
now() { read -r up _ < /proc/uptime 2>/dev/null; case "$up" in *.[0-9][0-9]) echo "${up%.*}${up#*.}" ;; *) echo 0 ;; esac; }
t0=$(now); i=0
while [ -n "$(job_pids)" ] && [ "$i" -lt 50 ] && [ $(( $(now) - t0 )) -lt 500 ]; do
  sleep 0.1; i=$((i+1))
done
# One look at /proc, then the KILL: a process forked between the two outlives it (a node'"'"'s
# shell still starting its hang-up guard and sampler when the teardown comes at once). A
# killed process forks no more, so looking again until a look finds none ends it all.
n=0
while p=$(job_pids); [ -n "$p" ] && [ "$n" -lt 50 ]; do
  kill -KILL $p 2>/dev/null; n=$((n+1)); sleep 0.01
done
sleep 0.05
echo "mlaunch-teardown: $(job_pids | wc -l) left"
'
exec 3<&0 </dev/null
(while [ -n "$(timeout 30 head -c 1 <&3 2>/dev/null)" ]; do :; done
 exec env -u MLAUNCH_RUN_ID -u MLAUNCH_NODE_ID /bin/sh -c "$hangup") >/dev/null 2>&1 &
exec 3<&-
# The live view's GPU/CPU samples (health.sample_every_s; templates/sampler.sh.j2), in a
# session of its own so that it can end all of itself (its pid, the session's, in the pidfile's
# .sampler for the teardown). Without MLAUNCH_IN_PROCESS: the stack
# dump takes a process with it for the job's one rank.
sampler='main=$1
[ -z "$2" ] || echo $$ > "$2"
if nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} \
    --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits \
    -lms 2000 2>/dev/null </dev/null |
    while IFS= read -r row; do printf "\036mlaunch-gpu %s\n" "$row"; done &
else
  printf "\036mlaunch-cpu-every %s\n" 2000
  exit 0
fi
exec >/dev/null 2>&1
alive() {
  [ -r "/proc/$1/status" ] || { kill -0 "$1" 2>/dev/null; return; }
  while read -r k v _; do [ "$k" = State: ] && break; done <"/proc/$1/status" 2>/dev/null
  [ "$k" = State: ] && [ "$v" != Z ]
}
while alive "$main"; do sleep 0.5; done
kill -TERM 0'
if command -v setsid >/dev/null 2>&1; then
  env -u MLAUNCH_IN_PROCESS setsid /bin/sh -c "$sampler" mlaunch-sampler "$$" /data/work/.mlaunch/root/GOLDEN/node1.pid.sampler </dev/null &
fi
# cluster.warm_start: where this session's warm frame (templates/warm.sh.j2) started torchrun's
# interpreter during the launcher's checks, with its imports done, it runs torchrun with this
# argv, in this directory, with this environment and the signals this shell ignores; where
# anything torchrun would inherit changed since (nodeprog/warm.py), it declines, and torchrun
# starts here as it would. The signal goes before `env` is renamed into place: once the warm
# process sees `env`, no signal of this hand-off is still to come.
if [ -n "${mlaunch_warm:-}" ]; then
  mlaunch_ign=
  while IFS= read -r mlaunch_l; do
    case $mlaunch_l in SigIgn:*) mlaunch_ign=${mlaunch_l#SigIgn:};; esac
  done < /proc/$$/status
  if echo "$mlaunch_warm" > /data/work/.mlaunch/root/GOLDEN/node1.pid &&
     printf '%s\0' "$PWD" "$mlaunch_ign" /opt/venvs/swift/bin/torchrun --nnodes 2 --nproc-per-node 4 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 --max-restarts 0 --tee 3 --log-dir /data/work/.mlaunch/root/GOLDEN/torchrun/node1 -m swift.cli._megatron.sft --model /data/models/Qwen2.5-14B-Instruct --model_type qwen2 --dataset /data/work/data/alpaca_zh_demo.json --max_length 4096 --tuner_type lora --lora_rank 8 --lora_alpha 32 --lora_dropout 0.05 --target_modules all-linear --torch_dtype bfloat16 --tensor_model_parallel_size 2 --pipeline_model_parallel_size 2 --sequence_parallel true --micro_batch_size 1 --global_batch_size 32 --lr 0.0001 --lr_decay_style cosine --lr_warmup_fraction 0.03 --num_train_epochs 1 --clip_grad 1.0 --recompute_granularity selective --save_steps 100 --logging_steps 5 --seed 42 --output_dir /data/work/output/qwen25-14b-swift-megatron --check_model false > "$mlaunch_hold/argv" &&
     env -0 > "$mlaunch_hold/env.part" &&
     { [ ! -e "$mlaunch_hold/ready" ] || kill -s USR1 "$mlaunch_warm" 2>/dev/null; } &&
     mv -- "$mlaunch_hold/env.part" "$mlaunch_hold/env"; then
    trap '' TERM INT HUP   # the teardown signals torchrun's group (the pidfile), as without a warm start
    wait "$mlaunch_warm"; mlaunch_rc=$?; mlaunch_warm=
    trap - TERM INT HUP
    if [ -e "$mlaunch_hold/taken" ] || [ "$mlaunch_rc" -gt 128 ]; then
      # torchrun ran and ended, or a teardown's signal ended the warm process first: nothing starts
      trap - EXIT
      rm -rf -- "$mlaunch_hold"
      [ "$mlaunch_rc" -gt 128 ] && kill -$((mlaunch_rc - 128)) $$   # ended by a signal: so does this shell
      exit "$mlaunch_rc"
    fi
  fi
  echo $$ > /data/work/.mlaunch/root/GOLDEN/node1.pid
fi
[ -z "${mlaunch_hold:-}" ] || { mlaunch_unwarm; trap - EXIT; }
exec /opt/venvs/swift/bin/torchrun --nnodes 2 --nproc-per-node 4 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500 --max-restarts 0 --tee 3 --log-dir /data/work/.mlaunch/root/GOLDEN/torchrun/node1 -m swift.cli._megatron.sft --model /data/models/Qwen2.5-14B-Instruct --model_type qwen2 --dataset /data/work/data/alpaca_zh_demo.json --max_length 4096 --tuner_type lora --lora_rank 8 --lora_alpha 32 --lora_dropout 0.05 --target_modules all-linear --torch_dtype bfloat16 --tensor_model_parallel_size 2 --pipeline_model_parallel_size 2 --sequence_parallel true --micro_batch_size 1 --global_batch_size 32 --lr 0.0001 --lr_decay_style cosine --lr_warmup_fraction 0.03 --num_train_epochs 1 --clip_grad 1.0 --recompute_granularity selective --save_steps 100 --logging_steps 5 --seed 42 --output_dir /data/work/output/qwen25-14b-swift-megatron --check_model false
