"""`python -m dist_jobs.backends.slurm.stepwatch --job ID --pid PID --errors FILE`: ends a job
step's srun that outlives its step.

When a node's link drops for less than SlurmdTimeout, the node is not declared down: its tasks end
(their hang watchdogs fire, or a peer is lost), its slurmstepd reports the step's end to
slurmctld once the link is back, and the step is gone from the job. srun, which missed the
tasks' exit messages while the link was down, waits on, and the batch script with it, until the
job's time limit (seen on the project's cluster: the step ended 43 s after its start, srun waited
out the 5-minute limit). The batch script starts this beside each step: every
DIST_JOBS_STEP_WATCH_SECONDS (default 30: one scontrol call, light on slurmctld) it looks for the
step srun `PID` started (`scontrol -o show step JOB`, its SrunHost:Pid). Once the step has been
seen and then is missing twice in a row (a srun that ends by itself returns within a moment of
its step), it appends its line to srun's stderr file, which the batch log shows and the step's
verdict reads (`step_lost`), and kills srun: nothing is left of the step for srun to clean up.
It exits when srun does.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dist_jobs.envnum import env_number
from dist_jobs.rundir.holder import running

WATCH_SECONDS = "DIST_JOBS_STEP_WATCH_SECONDS"
EVERY_S = 30.0
MISSED_LOOKS = 2
_LOST = "dist-jobs: srun lost its step:"

Show = Callable[[str], "dict[int, str] | None"]


def parse_steps(text: str) -> dict[int, str]:
    """`scontrol -o show step JOB`'s steps by their srun's pid: {pid: step id}. The batch step
    (SrunHost:Pid=(null):0) has no srun; "Job step ID. not found" (the job has ended) is none."""
    found = {}
    for line in text.splitlines():
        step, srun = re.search(r"\bStepId=(\S+)", line), re.search(r"\bSrunHost:Pid=\S*:(\d+)\b", line)
        if step and srun and int(srun.group(1)) > 0:
            found[int(srun.group(1))] = step.group(1)
    return found


def show_steps(job: str) -> dict[int, str] | None:
    """The job's steps now, or None when scontrol did not answer (slurmctld busy or restarting)."""
    try:
        done = subprocess.run(["scontrol", "-o", "show", "step", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 and "not found" not in done.stdout + done.stderr:
        return None
    return parse_steps(done.stdout)


def alive(pid: int) -> bool:
    """Whether srun still runs (not a zombie the batch shell has yet to reap), read as the lock's
    heartbeat reads the process it watches."""
    return running(pid, None)


def watch(
    job: str,
    pid: int,
    errors: Path,
    every: float,
    show: Show = show_steps,
    is_alive: Callable[[int], bool] = alive,
    kill: Callable[[int, int], None] = os.kill,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Look every `every` s until srun `pid` ends; True when its step was gone and this killed it."""
    step, missed = "", 0
    while is_alive(pid):
        steps = show(job)
        if steps is not None:
            if pid in steps:
                step, missed = steps[pid], 0
            elif step:
                missed += 1
            if missed >= MISSED_LOOKS:
                tell(errors, step, pid, missed * every)
                kill(pid, signal.SIGKILL)
                return True
        sleep(every)
    return False


def tell(errors: Path, step: str, pid: int, gone_s: float) -> None:
    line = (
        f"{_LOST} step {step} ended at SLURM at least {gone_s:.0f} s ago, but its srun (pid {pid}) never heard "
        "its tasks end (a node's link dropped and came back?): ending srun\n"
    )
    try:  # the batch script copies this file into the batch log
        with open(errors, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError:  # the verdict then reads srun's own exit (killed): the batch log says why
        sys.stderr.write(line)


def step_lost(errors_text: str) -> str:
    """What this told in srun's stderr file ("" when it ended no srun): the verdict's evidence."""
    for line in errors_text.splitlines():
        if line.startswith(_LOST):
            return line[len(_LOST) :].strip()
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m dist_jobs.backends.slurm.stepwatch")
    p.add_argument("--job", required=True, help="SLURM_JOB_ID")
    p.add_argument("--pid", type=int, required=True, help="the step's srun, a child of the batch shell")
    p.add_argument("--errors", type=Path, required=True, help="srun's stderr file, which the verdict reads")
    args = p.parse_args(argv)
    watch(args.job, args.pid, args.errors, interval(os.environ.get(WATCH_SECONDS, "")))
    return 0


def interval(text: str) -> float:
    """DIST_JOBS_STEP_WATCH_SECONDS (`text`), read by dist_jobs.envnum, or the default when unset or
    not a positive number (said once: a batch job has no one to read an error, and the watch must go on)."""
    try:
        every = env_number(WATCH_SECONDS, EVERY_S, {WATCH_SECONDS: text}, low=0.0)
    except ValueError:
        every = None
    if every:
        return every
    told = f"{WATCH_SECONDS}={text!r} is not a positive number of seconds"
    print(f"dist-jobs: {told}: looking every {EVERY_S:g} s", file=sys.stderr)
    return EVERY_S


if __name__ == "__main__":
    sys.exit(main())
