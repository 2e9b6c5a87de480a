# mlaunch run GOLDEN: node 0 of 2 on node1
export PYTHONUNBUFFERED=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export GLOO_SOCKET_IFNAME=eth0
export MLAUNCH_RUN_ID=GOLDEN
export MLAUNCH_NODE_RANK=0
export PATH=/usr/bin:"$PATH"
mkdir -p /tmp/mlaunch/.mlaunch/GOLDEN || exit 96
echo $$ > /tmp/mlaunch/.mlaunch/GOLDEN/node0.pid
exec /usr/bin/torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr node1 --master-port 29500 --max-restarts 0 --tee 3 --log-dir /tmp/mlaunch/.mlaunch/GOLDEN/torchrun/node0 /opt/mlaunch/examples/allreduce.py --size-mb 64
