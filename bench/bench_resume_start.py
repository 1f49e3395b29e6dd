"""Process start to first training step: resuming a ~200 MB checkpoint vs a fresh start (goal <= +0.3 s).

    .venv/bin/python bench/bench_resume_start.py [--repeats 3]

`python -m dist_jobs.train` under torchrun, 2 CPU processes, a model of 25.5 M parameters
(Linear 768 -> 32768 -> 10: 102 MB of weights, plus 102 MB of SGD momentum = a 204 MB
checkpoint). The clock starts just before torchrun is launched and stops when rank 0's first
training forward begins (stamped inside the model). A fresh start gets an empty checkpoint
folder; a resume finds the newest checkpoint of the prepared run, loads it and trains one
more step (so every resume loads a full checkpoint). Runs alternate; medians are compared.
The checkpoint files were just written, so they are in the page cache: this measures the
runtime's own cost, not the storage's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_train_steps import stamped, torchrun

HIDDEN = 32768


def big(num_classes: int = 10) -> Any:
    """Factory for the entrypoint: --model bench_resume_start:big."""
    from torch import nn

    return stamped(
        nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, num_classes))
    )


def job(checkpoints: Path, max_steps: int) -> list[str]:
    return [
        "-m",
        "dist_jobs.train",
        "--model",
        "bench_resume_start:big",
        "--image-size",
        "16",
        "--fake-samples",
        "4096",
        "--batch-size",
        "8",
        "--checkpoint-dir",
        str(checkpoints),
        "--max-steps",
        str(max_steps),
        "--lr",
        "0.01",
    ]


def to_first_step(checkpoints: Path, max_steps: int, stamps: Path) -> tuple[float, float]:
    """(launch -> first step, model built -> first step) in seconds."""
    start = time.time()
    torchrun(job(checkpoints, max_steps), {"BENCH_STAMPS": str(stamps)})
    got = json.loads(stamps.read_text())
    return got["steps"][0] - start, got["steps"][0] - got["built"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        stamps, resumed = tmp / "stamps.json", tmp / "resumed"
        to_first_step(resumed, 1, stamps)  # writes step-1, the checkpoint to resume from
        size = sum(f.stat().st_size for f in (resumed / "default" / "step-1").iterdir())
        print(f"checkpoint: {size / 1e6:.0f} MB")
        fresh, resume = [], []
        for i in range(args.repeats):
            fresh.append(to_first_step(tmp / f"fresh{i}", 1, stamps))
            resume.append(to_first_step(resumed, 2 + i, stamps))  # loads step-(1+i)
    for name, runs in (("fresh", fresh), ("resume", resume)):
        print(
            f"{name:>6}: launch -> first step "
            + " ".join(f"{a:.2f}" for a, _ in runs)
            + " s; model built -> first step "
            + " ".join(f"{b:.2f}" for _, b in runs)
            + " s"
        )
    for which, label in ((0, "process start"), (1, "model built")):
        extra = statistics.median(r[which] for r in resume) - statistics.median(f[which] for f in fresh)
        print(
            f"resuming a {size / 1e6:.0f} MB checkpoint, {label} -> first step: {extra:+.2f} s "
            f"(median of {args.repeats}; goal <= +0.3 s)"
        )


if __name__ == "__main__":
    main()
