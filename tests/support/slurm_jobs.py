"""Jobs on the real 2-node SLURM cluster of slurm/cluster/up.sh, as the cluster tests submit them.

Every job is small: the tiny conv net of support/workloads.py on the fake images, deterministic, gloo
on CPU, one CPU per rank. Jobs run as root on this machine's filesystem, so they find this Python
through a `setup` line (PATH) and the repo and tests/ through PYTHONPATH in the spec's `env`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from dist_jobs.backends.base import JobStatus
from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.backends.slurm.logs import attempt_files
from dist_jobs.backends.slurm.squeue_sacct import SACCT_FIELDS, SacctJobState, parse_sacct, sacct_job_state
from support.paths import REPO, TESTS
from support.specs import PREEMPTIBLE_TRAIN
from support.waiting import eventually

VENV_BIN = Path(sys.executable).parent
TOTAL_STEPS = 24  # 128 samples / (4 ranks x batch 4) = 8 steps an epoch, 3 epochs
TRAIN: dict[str, Any] = PREEMPTIBLE_TRAIN
# tiny_net sleeps this long in every training forward: wall time only, never the numbers.
# Only the first attempt is slowed, so it is still training when it is preempted and the
# resumed attempt is over before a second warning could come.
SLOW_FIRST_ATTEMPT = 'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then export DJ_TEST_STEP_DELAY=%s; fi'


def spec_data(
    root: Path,
    name: str,
    train: dict[str, Any] | None = None,
    *,
    procs_per_node: int = 2,
    unbuffered: bool = True,
    **fields: Any,
) -> dict[str, Any]:
    """A 2 x `procs_per_node` job (training TRAIN unless `train` is given) whose logs and
    checkpoints live under `root` (this machine's shared filesystem); `unbuffered`: its ranks
    write their logs unbuffered (PYTHONUNBUFFERED=1)."""
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "OMP_NUM_THREADS": "1"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return {
        "name": name,
        "nodes": 2,
        "procs_per_node": procs_per_node,
        "cpus_per_task": 1,
        "time": "5",
        "log_dir": str(root / "logs"),
        "checkpoint_dir": str(root / "checkpoints"),
        "setup": [f'export PATH="{VENV_BIN}:$PATH"'],
        "env": env,
        "train": dict(train or TRAIN),
        **fields,
    }


def write_spec(root: Path, data: dict[str, Any]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`dist-jobs ARGS` run from `root`, job directories in root/runs."""
    argv = [sys.executable, "-m", "dist_jobs", *args]
    if args[0] in ("submit", "status", "logs", "cancel", "list"):
        argv[3:4] = [args[0], "--jobs-dir", str(root / "runs")]
    return subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=timeout)


def submit(root: Path, spec: Path, *command: str) -> str:
    proc = cli(root, "submit", "--backend", "slurm", str(spec), *(["--", *command] if command else []))
    assert proc.returncode == 0, f"dist-jobs submit failed:\n{proc.stderr}"
    handle = proc.stdout.strip()  # slurm://<cluster>/<id>
    assert handle.startswith("slurm://"), proc.stdout
    job_id = handle.rsplit("/", 1)[1]
    assert job_id.isdigit(), proc.stdout
    return job_id


def backend(root: Path) -> SlurmBackend:
    return SlurmBackend(jobs_dir=root / "runs", cwd=root)


def logs(root: Path, job_id: str, rank: int) -> str:
    proc = cli(root, "logs", "--backend", "slurm", "--rank", str(rank), job_id)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def batch_log(root: Path, name: str, job_id: str) -> str:
    path = root / "logs" / f"{name}-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else "(no batch log)"


def wait_for(what: str, ready: Any, timeout: float, job_id: str, root: Path, name: str) -> Any:
    """Poll `ready()` until it is truthy; on timeout cancel the job and fail with its logs."""

    def logs() -> str:
        files = sorted((root / "logs").glob(f"{name}-{job_id}-attempt*-rank0.out"))
        rank0 = "\n".join(f"{p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in files)
        return f"--- batch log:\n{batch_log(root, name, job_id)}\n--- rank 0:\n{rank0}"

    return eventually(
        ready,
        timeout=timeout,
        interval=1.0,
        what=f"{what} of job {job_id}",
        on_timeout=lambda: subprocess.run(["scancel", job_id], capture_output=True),
        context=logs,
    )


def wait_finished(root: Path, name: str, job_id: str, timeout: float = 150) -> JobStatus:
    """The job's final status. A requeued job is held PENDING (Reason=BeginTime) for the cluster's
    credential lifetime (cred_expire=5 here): pushing it with `scontrol update StartTime=now`
    sooner gets it killed ("Killing non-startable batch job: Job credential revoked"), so wait."""
    slurm = backend(root)

    def finished() -> JobStatus | None:
        status = slurm.status(job_id)
        return status if status.finished else None

    return wait_for("end", finished, timeout, job_id, root, name)


def final_sacct_state(job_id: str) -> tuple[str, int]:
    """(state, attempts) from sacct --duplicates, polled until slurmdbd has the final record."""
    answer: list[subprocess.CompletedProcess[str]] = []

    def record() -> SacctJobState | None:
        argv = ["sacct", "--parsable2", "--noheader", "--duplicates", "--jobs", job_id, "--format", SACCT_FIELDS]
        answer[:] = [subprocess.run(argv, capture_output=True, text=True, timeout=30)]
        return sacct_job_state(parse_sacct(answer[0].stdout), job_id) if answer[0].returncode == 0 else None

    state = eventually(
        record,
        until=lambda state: state is not None and state.state not in ("RUNNING", "PENDING", "REQUEUED"),
        timeout=30,
        interval=1.0,
        what=f"sacct's final record of job {job_id}",
        context=lambda: f"sacct said: {answer[0].stdout}{answer[0].stderr}" if answer else "",
    )
    assert state is not None
    return state.state, state.attempts


def committed_steps(checkpoints: Path) -> list[int]:
    return sorted(int(p.name[5:]) for p in checkpoints.glob("step-*") if (p / "COMPLETE").exists())


def resumed_step(root: Path, name: str, job_id: str) -> int:
    """The step rank 0 first resumed from after its first attempt (a requeue's, or a restart in
    place's). A later attempt that ended before it could resume (its rendezvous failed while a
    link was still down) is passed over: the resume that counts is the first one logged."""
    files = attempt_files(root / "logs", name, job_id, 0)
    assert len(files) >= 2, f"rank 0 has no second attempt: {files}"
    pattern = rf"resumed from \S+/{name}/step-(\d+): .* step (\d+) overall"
    found = [(f, m) for f in files[1:] if (m := re.search(pattern, f.read_text(errors="replace")))]
    assert found, "no attempt after the first logged a resume:\n" + "\n".join(
        f"{f.name}: {f.read_text(errors='replace')[-1000:]}" for f in files[1:]
    )
    match = found[0][1]
    assert match.group(1) == match.group(2)
    return int(match.group(1))
