# mlaunch run GOLDEN: node ${SLURM_NODEID} of 4 on (allocated)
# Secret values are not in this file, nor in the batch script Slurm stores: a 0600 file.
if [ -f /mnt/shared/work/.mlaunch/GOLDEN/secrets/env.sh ]; then . /mnt/shared/work/.mlaunch/GOLDEN/secrets/env.sh || exit 96; fi
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export NCCL_SOCKET_IFNAME=eth0
export NCCL_DEBUG=WARN
export MLAUNCH_RUN_ID=GOLDEN
export MLAUNCH_NODE_RANK="${SLURM_NODEID}"
export MLAUNCH_NODE_ID=GOLDEN.node"${SLURM_NODEID}"
export PATH=/opt/conda/bin:"$PATH"
mkdir -p -- /mnt/shared/work || exit 96
# The run's directories are this user's and 0700 (pidfiles, rank logs): one that belongs to
# another user is refused before anything is made in it. The shell's own tests, a program only
# to make a missing one and one chmod for all: every node runs this in each session, and each
# program costs ~1 ms of CPU.
for d in /mnt/shared/work/.mlaunch /mnt/shared/work/.mlaunch/GOLDEN; do
  [ -d "$d" ] || mkdir -m 700 -- "$d" 2>/dev/null || [ -d "$d" ] || { echo "mlaunch: cannot create $d on $(hostname)" >&2; exit 96; }
  [ -O "$d" ] || { echo "mlaunch: $d on $(hostname) belongs to $(stat -L -c %U -- "$d") (uid $(stat -L -c %u -- "$d")), not to $(id -un) (uid $(id -u)); remove it as its owner, or set cluster.workdir to a directory of yours" >&2; exit 96; }
done
chmod 700 -- /mnt/shared/work/.mlaunch /mnt/shared/work/.mlaunch/GOLDEN || exit 96
cd /mnt/shared/work || exit 96
# No hang-up guard under Slurm: the scheduler owns teardown (srun --kill-on-bad-exit, scancel).
exec /opt/conda/bin/torchrun --nnodes 4 --nproc-per-node 4 --node-rank "${SLURM_NODEID}" --master-addr "${MLAUNCH_MASTER_ADDR}" --master-port 29500 --max-restarts 0 --tee 3 --log-dir /mnt/shared/work/.mlaunch/GOLDEN/torchrun/node"${SLURM_NODEID}" /mnt/shared/work/.mlaunch/GOLDEN/llamafactory_entry.py /mnt/shared/work/.mlaunch/GOLDEN/llamafactory.yaml
