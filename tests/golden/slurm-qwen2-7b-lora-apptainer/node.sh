# mlaunch run GOLDEN: node ${SLURM_NODEID} of 4 on (allocated)
# Secret values are not in this file, nor in the batch script Slurm stores: a 0600 file.
if [ -f /mnt/shared/work/.mlaunch/user/GOLDEN/secrets/env.sh ]; then . /mnt/shared/work/.mlaunch/user/GOLDEN/secrets/env.sh || exit 96; fi
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
# <workdir>/.mlaunch is the team's (1777 and sticky: each user's directory in it is safe from
# the others); one that is a link is refused, one of another user's is used as it is, and this
# user's own is opened to the team (older mlaunch made it 0700, which shut the others out).
s=/mnt/shared/work/.mlaunch
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
for d in /mnt/shared/work/.mlaunch/user /mnt/shared/work/.mlaunch/user/GOLDEN; do
  [ -d "$d" ] || mkdir -m 700 -- "$d" 2>/dev/null
  [ -L "$d" ] && { echo "mlaunch: $d on $(hostname) is a link (to $(readlink -- "$d")), not a directory of $(id -un)'s; remove it, or set cluster.workdir to a directory of yours" >&2; exit 96; }
  [ -d "$d" ] || { echo "mlaunch: cannot create $d on $(hostname) (in a directory of $(stat -c %U -- "${d%/*}")'s)" >&2; exit 96; }
  [ -O "$d" ] || { echo "mlaunch: $d on $(hostname) belongs to $(stat -c %U -- "$d") (uid $(stat -c %u -- "$d")), not to $(id -un) (uid $(id -u)); remove it as its owner, or set cluster.workdir to a directory of yours" >&2; exit 96; }
done
chmod 700 -- /mnt/shared/work/.mlaunch/user /mnt/shared/work/.mlaunch/user/GOLDEN || exit 96
cd /mnt/shared/work || exit 96
# No hang-up guard under Slurm: the scheduler owns teardown (srun --kill-on-bad-exit, scancel).
# cluster.container: torchrun runs in the image.
exec apptainer exec --nv --bind /mnt/shared/output/qwen-lora:/mnt/shared/output/qwen-lora,/mnt/shared/work:/mnt/shared/work,/mnt/shared/models:/models:ro --pwd /mnt/shared/work /mnt/shared/images/trainer-2026.11.sif /opt/conda/bin/torchrun --nnodes 4 --nproc-per-node 4 --node-rank "${SLURM_NODEID}" --master-addr "${MLAUNCH_MASTER_ADDR}" --master-port 29500 --max-restarts 0 --tee 3 --log-dir /mnt/shared/work/.mlaunch/user/GOLDEN/torchrun/node"${SLURM_NODEID}" /mnt/shared/work/.mlaunch/user/GOLDEN/llamafactory_entry.py /mnt/shared/work/.mlaunch/user/GOLDEN/llamafactory.yaml
