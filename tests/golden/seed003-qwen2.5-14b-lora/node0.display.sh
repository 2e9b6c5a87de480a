# mlaunch run GOLDEN: node 0 of 2 on 10.0.0.1
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_SOCKET_IFNAME=eth0
export NCCL_IB_DISABLE=1
export MLAUNCH_RUN_ID=GOLDEN
export MLAUNCH_NODE_RANK=0
export PATH=/opt/venvs/train/bin:"$PATH"
mkdir -p /data/work/.mlaunch/GOLDEN || exit 96
cd /data/work || exit 96
echo $$ > /data/work/.mlaunch/GOLDEN/node0.pid
exec /opt/venvs/train/bin/torchrun --nnodes 2 --nproc-per-node 4 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500 --max-restarts 0 --tee 3 --log-dir /data/work/.mlaunch/GOLDEN/torchrun/node0 -m llamafactory.launcher /data/work/.mlaunch/GOLDEN/llamafactory.yaml
