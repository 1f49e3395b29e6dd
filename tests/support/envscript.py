"""A plain DDP script in the style of pytorch/examples, knowing nothing of dist-jobs.

It relies on torch's env:// contract alone: `init_process_group("gloo")` reads RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the device comes from LOCAL_RANK. It prints one
`RESULT {json}` line per rank: who it is, where, and the all_reduce of all ranks' numbers.
"""

import json
import os
import socket

import torch
import torch.distributed as dist


def report() -> dict:
    """Join the group through env://, all_reduce the ranks, and say who and where this process is."""
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    names = ("LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
    found = {
        "rank": rank,
        "world": world,
        "local_rank": local_rank,
        "sum": total.item(),
        "host": socket.gethostname(),
        **{n.lower(): os.environ.get(n) for n in names},
    }
    dist.destroy_process_group()
    return found


def main() -> None:
    print("RESULT " + json.dumps(report(), sort_keys=True), flush=True)


if __name__ == "__main__":
    main()
