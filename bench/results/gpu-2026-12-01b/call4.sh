#!/bin/bash
# Device call 4 (one H200): nvidia-smi while a GPU trains, for the live per-node view's test
# data. The job is a plain torch training loop (bf16 MLP, AdamW, 40 s) started in the
# background; nvidia-smi samples every 500 ms for 40 s and once with its header.
python3 - <<'PY' &
import time, torch
m = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(8)]).cuda().bfloat16()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t0 = time.time()
while time.time() - t0 < 42:
    loss = m(x).float().pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
torch.cuda.synchronize(); print("trained", round(time.time() - t0, 1), "s, loss", loss.item())
PY
sleep 2
(sleep 15; nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv \
    > $OUT/nvidia-smi-h200-header.csv) &   # kept as tests/data/nvidia-smi-h200-mlp*.csv
timeout 40 nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total \
    --format=csv,noheader,nounits -lms 500 > $OUT/nvidia-smi-h200.csv
wait
