"""A plain DDP script: it reads torch's env:// variables and knows nothing of dist-jobs."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")  # nccl on GPUs
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(256, 8)
y = x.sum(dim=1, keepdim=True)
shard = slice(rank, None, world)  # each rank its own part of the data
for step in range(1, 101):
    loss = torch.nn.functional.mse_loss(model(x[shard]), y[shard])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 25 == 0:
        dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} (mean of {world} ranks)", flush=True)
if rank == 0:
    print(f"done on {world} ranks; LOCAL_RANK {os.environ['LOCAL_RANK']}, MASTER_ADDR {os.environ['MASTER_ADDR']}")
dist.destroy_process_group()
# torch's gloo threads may still be releasing tensors; one that needs the GIL once the interpreter
# has begun to exit aborts the process (SIGABRT, pytorch/pytorch#190489). A moment for them first.
time.sleep(0.05)
