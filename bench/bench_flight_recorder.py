"""What torch's Flight Recorder costs a collective on gloo: 2 CPU processes under torchrun, each
timing 3,000 all_reduces of 1,000 floats with the recorder off and on (TORCH_FR_BUFFER_SIZE),
the two taking turns (dist_jobs.train.flight turns it on by default).

    python bench/bench_flight_recorder.py [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COLLECTIVES = 3000


def worker() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    tensor = torch.ones(1000)
    for _ in range(200):  # warm-up
        dist.all_reduce(tensor)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(COLLECTIVES):
        dist.all_reduce(tensor)
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"us {(time.perf_counter() - started) / COLLECTIVES * 1e6:.1f}")
    dist.destroy_process_group()


def run(recorder: bool) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    if recorder:
        env["TORCH_FR_BUFFER_SIZE"] = "2000"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, "--worker"]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("us ")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker()
        return
    off, on = [], []
    for _ in range(args.rounds):
        off.append(run(False))
        on.append(run(True))
    print(f"per all_reduce, off: {[round(v) for v in off]} us, on: {[round(v) for v in on]} us")
    print(
        f"median off {statistics.median(off):.0f} us, on {statistics.median(on):.0f} us: "
        f"{statistics.median(on) / statistics.median(off):.3f}x"
    )


if __name__ == "__main__":
    main()
