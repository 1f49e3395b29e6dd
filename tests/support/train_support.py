"""Shared by the training tests (tests/*/test_train_*.py): 2-rank CPU launches and what they
leave (the models and data sets the ranks train are support.workloads).
torch is imported inside the functions: collecting this file costs nothing.
Every launch runs in its own session and `Launch.kill()` reaps the whole tree (torchrun starts
its children in sessions of their own, so the tree is found through /proc).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.ranks.ports import free_port
from dist_jobs.rundir.hang import read_preempted
from support.paths import REPO, TESTS
from support.waiting import HUNG_S, eventually

PYTHON = sys.executable
STEP_RE = re.compile(r"step (\d+)/(\d+) epoch")


def test_launch_helpers_find_a_child_process(tmp_path: Path) -> None:
    launch = Launch(
        [PYTHON, "-c", "import subprocess,sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"],
        tmp_path / "log",
        {},
    )
    try:
        eventually(lambda: launch.tree()[1:], timeout=HUNG_S, interval=0.05, what="the launch's child process")
        assert len(launch.tree()) == 2
    finally:
        launch.kill()
    assert launch.proc.poll() is not None and not launch.tree()


def clipped_sgd_step(**fields: Any) -> Any:
    """The TrainConfig of one plain SGD step on CPU whose move is the clipped gradient: lr 1, no
    momentum, weight decay or schedule, gradient norm clipped to 1e-3, one batch of 8, no eval.
    `fields` add to it (strategy="fsdp")."""
    from dist_jobs.spec.train import TrainConfig

    return TrainConfig(
        optimizer="sgd",
        momentum=0.0,
        weight_decay=0.0,
        lr=1.0,
        grad_clip=1e-3,
        max_steps=1,
        batch_size=8,
        scheduler="constant",
        progress=False,
        eval_every_epoch=False,
        device="cpu",
        **fields,
    )


# -- launching ---------------------------------------------------------------------------------
def child_env(**extra: str) -> dict[str, str]:
    """This environment minus launcher variables, with the repo and tests/ importable."""
    drop = re.compile(
        r"^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|"
        r"GROUP_RANK|TORCHELASTIC_.*|SLURM_.*|OMPI_.*|PMIX_.*|PET_.*|DIST_JOBS_.*)$"
    )
    env = {k: v for k, v in os.environ.items() if not drop.match(k)}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS)]),
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def run_all(script: Path, envs: list[dict[str, str]], timeout: float) -> list[subprocess.CompletedProcess[str]]:
    """Start every child, wait with one deadline, and kill them all if anything is late."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)], env=env, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for env in envs
    ]
    deadline = time.monotonic() + timeout  # one budget for blocking waits (pipes read), not a poll
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        pytest.fail(f"children still running after {timeout}s (rendezvous hang?)")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return results


class Launch:
    """One process (torchrun, or one rank) writing stdout+stderr to `log`."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def last_step(self) -> int:
        steps = [int(m.group(1)) for m in STEP_RE.finditer(self.text())]
        return max(steps, default=0)

    def tree(self) -> list[int]:
        """This process and all its living descendants (pids)."""
        return [pid for pid in descendants(self.proc.pid) if _alive(pid)]

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.proc.args!r} still ran after {timeout}s:\n{self.text()[-3000:]}") from None

    def kill(self) -> None:
        for pid in reversed(self.tree()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def rank_of(pid: int) -> int | None:
    """The RANK a torchrun child was given, read from its environment."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def start_ranks(
    args: list[str], logs: Path, *, world: int = 2, command: list[str] | None = None, **extra: str
) -> list[Launch]:
    """`world` ranks of `command` (default python -m dist_jobs.train) + args, env:// by hand."""
    command = command or [PYTHON, "-m", "dist_jobs.train"]
    port = str(free_port())
    launches = []
    for rank in range(world):
        env = child_env(
            DIST_JOBS_ENV="torchrun",
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            DIST_JOBS_RDZV_TIMEOUT="60",
            **extra,
        )
        launches.append(Launch([*command, *args], logs / f"rank{rank}.log", env))
    return launches


def start_torchrun(args: list[str], log: Path, *, nproc: int = 2, **extra: str) -> Launch:
    argv = [
        PYTHON,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-port",
        str(free_port()),
        "-m",
        "dist_jobs.train",
        *args,
    ]
    return Launch(argv, log, child_env(DIST_JOBS_RDZV_TIMEOUT="60", **extra))


def wait_all(launches: list[Launch], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout  # one budget for blocking waits, not a poll
    try:
        return [launch.wait(max(1.0, deadline - time.monotonic())) for launch in launches]
    finally:
        kill_all(launches)


def kill_all(launches: list[Launch]) -> None:
    for launch in launches:
        launch.kill()


def final_state(run_dir: Path) -> dict[str, Any]:
    """The shared part of the newest checkpoint in run_dir."""
    from dist_jobs.train.checkpoint.checkpointer import Checkpointer

    loaded = Checkpointer(run_dir, rank=1, world_size=2).latest()  # rank 1: removes nothing
    assert loaded is not None, f"no complete checkpoint in {run_dir}"
    return loaded.shared


def newest_state(run_dir: Path) -> dict[str, Any]:
    """{"model": ..., "optimizer": ..., "shared": ...} of the newest checkpoint, sharded (read
    whole with torch's own DCP consolidation) or not. A sharded optimizer is keyed by name."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from dist_jobs.train.checkpoint.checkpointer import Checkpointer

    loaded = Checkpointer(run_dir, rank=1, world_size=2).latest()
    assert loaded is not None, f"no complete checkpoint in {run_dir}"
    if loaded.shared.get("format") != "dcp":
        return {"model": loaded.shared["model"], "optimizer": loaded.shared["optimizer"], "shared": loaded.shared}
    import torch

    whole = run_dir / f".whole-{loaded.step}.pt"
    dcp_to_torch_save(loaded.path, whole)
    state = torch.load(whole, weights_only=True)
    whole.unlink()
    return {"model": state["model"], "optimizer": state["optimizer"], "shared": loaded.shared}


def max_difference(got: dict[str, Any], want: dict[str, Any]) -> float:
    """The largest |difference| over the tensors of two state dicts with the same keys."""
    assert got.keys() == want.keys(), sorted(set(got) ^ set(want))
    return max(float((got[k].float() - want[k].float()).abs().max()) for k in want)


def assert_bit_identical(got: Any, want: Any, where: str = "state") -> None:
    """torch.equal on every tensor, == on everything else, recursively."""
    import torch

    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, where
        assert torch.equal(got, want), f"{where} differs: max |diff| {(got - want).abs().max()}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"{where}: keys differ"
        for key in want:
            assert_bit_identical(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: lengths differ"
        for i, (a, b) in enumerate(zip(got, want)):
            assert_bit_identical(a, b, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def descendants(root: int) -> list[int]:
    """`root` and every process below it now (pids, from /proc's children lists)."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if not Path(f"/proc/{pid}").exists():
            continue
        found.append(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return found


def preempted_why(run_dir: Path) -> str:
    """What rank 0's PREEMPTED marker in `run_dir` says (the step it checkpointed, as text)."""
    marker = read_preempted(run_dir)
    assert marker is not None, f"no PREEMPTED marker in {run_dir}"
    return marker.why
