"""The README demo (`make demo`): train 2 nodes x 2 processes locally, interrupt, resume.

It runs the real CLI, `dist-jobs run --backend local --nodes 2 --gpus 2`, so what you see is
what a user gets: on a machine without GPUs it says so and uses gloo on the CPU. Once the first
checkpoint is committed it presses Ctrl-C on the run (the ranks checkpoint at the next step
boundary and stop), then starts the same command again, which resumes from the latest checkpoint.
A command-line program, so it prints.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKDIR = Path("dist-jobs-demo")
RUN = "demo"
COMMAND = [
    sys.executable,
    "-m",
    "dist_jobs",
    "run",
    "--backend",
    "local",
    "--nodes",
    "2",
    "--gpus",
    "2",
    "--name",
    RUN,
    "--checkpoint-dir",
    "checkpoints",
    "--set",
    "train.model=resnet18",
    "--set",
    "train.data=fake",
    "--set",
    "train.fake_samples=512",
    "--set",
    "train.image_size=32",
    "--set",
    "train.batch_size=16",
    "--set",
    "train.epochs=2",
    "--set",
    "train.checkpoint_every_steps=4",
    "--set",
    "train.progress=false",
    "--set",
    "train.log_every=4",
]


def _say(text: str) -> None:
    print(f"\n=== demo: {text}", flush=True)


def _committed(folder: Path) -> list[str]:
    return sorted(
        (p.name for p in folder.glob("step-*") if (p / "COMPLETE").exists()), key=lambda n: int(n.split("-")[1])
    )


def _first_run(ckpt: Path) -> int:
    proc = subprocess.Popen(COMMAND, cwd=WORKDIR)
    try:
        while proc.poll() is None:
            if len(_committed(ckpt)) >= 2:
                _say(
                    f"checkpoints {', '.join(_committed(ckpt))} are committed: pressing Ctrl-C "
                    "(the ranks checkpoint at the next step boundary and stop)"
                )
                proc.send_signal(signal.SIGINT)
                break
            time.sleep(0.5)
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()


def main() -> int:
    if WORKDIR.exists():
        shutil.rmtree(WORKDIR)
    WORKDIR.mkdir()
    ckpt = WORKDIR / "checkpoints" / RUN
    _say("training ResNet-18 on FakeData, 2 nodes x 2 processes, as local processes")
    print("    " + " ".join(COMMAND[1:]), flush=True)
    code = _first_run(ckpt)
    saved = ", ".join(_committed(ckpt)) or "none"
    _say(f"first run stopped with exit code {code} (200: every rank checkpointed); committed checkpoints: {saved}")
    if not _committed(ckpt):
        return 1
    _say("starting the same command again: it resumes from the latest checkpoint")
    code = subprocess.run(COMMAND, cwd=WORKDIR).returncode
    _say(f"second run finished with exit code {code}; checkpoints now: {', '.join(_committed(ckpt))}")
    return code


if __name__ == "__main__":
    sys.exit(main())
