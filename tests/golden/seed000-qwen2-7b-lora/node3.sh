# mlaunch run GOLDEN: node 3 of 4 on 192.168.1.13
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_SOCKET_IFNAME=eth0
export NCCL_DEBUG=WARN
export HF_TOKEN=hf_secret_value_123
export MLAUNCH_RUN_ID=GOLDEN
export MLAUNCH_NODE_RANK=3
export PATH=/opt/conda/bin:"$PATH"
mkdir -p /mnt/shared/work/.mlaunch/GOLDEN || exit 96
cd /mnt/shared/work || exit 96
echo $$ > /mnt/shared/work/.mlaunch/GOLDEN/node3.pid
exec /opt/conda/bin/torchrun --nnodes 4 --nproc-per-node 4 --node-rank 3 --master-addr 192.168.1.10 --master-port 29500 --max-restarts 0 --tee 3 --log-dir /mnt/shared/work/.mlaunch/GOLDEN/torchrun/node3 -m llamafactory.launcher /mnt/shared/work/.mlaunch/GOLDEN/llamafactory.yaml
