"""The README demo (`make demo`): train 2 nodes x 2 processes on this machine, interrupt, resume, learn.

It runs the real CLI, `dist-jobs run --backend NAME --nodes 2 --gpus 2`, NAME the registry's
backend that runs jobs here (Backend.runs_here), so what you see is what a user gets: on a
machine without GPUs it says so and uses gloo on the CPU. Once the first checkpoint is committed
it presses Ctrl-C on the run (the ranks checkpoint at the next step boundary and stop), then
starts the same command again, which resumes from the latest checkpoint. A command-line
program, so it prints.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from dist_jobs import api

WORKDIR = Path("dist-jobs-demo")
RUN = "demo"
# the registry's first backend that runs a job here, as `dist-jobs run` picks by default
HERE = next(cls.name for cls in api.backend_classes() if cls.runs_here)
# The built-in character-level GPT on its generated English-like corpus: a task it can learn, so
# the held-out loss falls and next-character accuracy rises epoch by epoch (on random labels
# nothing is learnt). Sized for about two minutes on 2 CPU cores, interruption and resume included.
COMMAND = [
    sys.executable,
    "-m",
    "dist_jobs",
    "run",
    "--backend",
    HERE,
    "--nodes",
    "2",
    "--gpus",
    "2",
    "--name",
    RUN,
    "--checkpoint-dir",
    "checkpoints",
    *(
        arg
        for item in (
            "model=gpt",
            "data=text",
            "text_chars=150000",
            "seq_len=64",
            "gpt_layers=2",
            "gpt_heads=4",
            "gpt_width=128",
            "batch_size=16",
            "epochs=6",
            "optimizer=adamw",
            "lr=0.004",
            "checkpoint_every_steps=20",
            "progress=false",
            "log_every=20",
        )
        for arg in ("--set", f"train.{item}")
    ),
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
    _say(f"training a small character-level GPT on generated text, 2 nodes x 2 processes, as {HERE} processes")
    print("    " + " ".join(COMMAND[1:]), flush=True)
    code = _first_run(ckpt)
    saved = ", ".join(_committed(ckpt)) or "none"
    _say(f"first run stopped with exit code {code} (200: every rank checkpointed); committed checkpoints: {saved}")
    if not _committed(ckpt):
        return 1
    _say("starting the same command again: it resumes from the latest checkpoint")
    code = subprocess.run(COMMAND, cwd=WORKDIR).returncode
    _say(f"second run finished with exit code {code}; checkpoints now: {', '.join(_committed(ckpt))}")
    for line in _learning(ckpt):
        print("    " + line, flush=True)
    return code


def _learning(run_dir: Path) -> list[str]:
    """Each epoch's held-out loss and accuracy, from the run's metrics.jsonl: it learnt."""
    rows: list[str] = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        metrics = json.loads(line).get("metrics", {})
        if "eval_loss" in metrics:
            loss, accuracy = metrics["eval_loss"], metrics.get("eval_accuracy", 0.0)
            rows.append(f"epoch {len(rows)}: eval_loss {loss:.3f}, accuracy {accuracy:.3f}")
    return ["what it learnt (held-out next-character loss and accuracy):", *rows] if rows else []


if __name__ == "__main__":
    sys.exit(main())
