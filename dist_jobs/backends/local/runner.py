"""`dist-jobs run --backend local`: the job as N x P local processes, with the cluster's environment.

srun mode gives every process the variables a SLURM task gets (SLURM_PROCID, SLURM_LOCALID,
SLURM_NODEID, step counts and nodelists); torchrun mode starts one torchrun per "node" with the
same c10d rendezvous the sbatch script uses. All "nodes" share this host, so the master is
loopback, which the self-check accepts only because DIST_JOBS_BACKEND=local says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from dist_jobs.backends.base import Prepared, SnapshotPlan, made, run_dir_of
from dist_jobs.backends.local.procs import ProcessGroup
from dist_jobs.backends.preflight import MissingPackages, check_trainer_packages, missing_packages
from dist_jobs.backends.snapshot import planned, take
from dist_jobs.constants import TORCHRUN_MODULE
from dist_jobs.ranks.ports import free_port
from dist_jobs.ranks.threads import SHARING_VAR
from dist_jobs.render.common import step_signal, torchrun_tail
from dist_jobs.render.quoting import sh_argv
from dist_jobs.rundir.hang import attempt_hang, describe_hang, preempted_since
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lease import held
from dist_jobs.rundir.lock import LOCK_NAME, Lock, new_token
from dist_jobs.rundir.verdict import Action, Evidence, decide, record
from dist_jobs.spec import JobSpec
from dist_jobs.spec.env import job_env

MASTER = "127.0.0.1"


@dataclass(frozen=True)
class LocalProc:
    label: str  # printed before each line of its output
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment


def visible_gpus(environ: dict[str, str] | None = None) -> int:
    """GPUs this machine offers, without importing torch (render-side module)."""
    env = os.environ if environ is None else environ
    mask = env.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        return len([d for d in mask.split(",") if d.strip() and d.strip() != "-1"])
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _common_env(spec: JobSpec, workdir: Path, port: int, use_gpus: bool) -> dict[str, str]:
    # Every "node" is this host: all processes share its CPUs (the launcher's thread count).
    launch = {
        "MASTER_ADDR": MASTER,
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
        SHARING_VAR: str(spec.world_size),
    }
    if not use_gpus:
        launch["CUDA_VISIBLE_DEVICES"] = ""  # gloo on CPU, even where a smaller GPU count exists
    # The user's env (inside job_env) wins over the launch defaults, as on a cluster.
    return {**launch, **job_env(spec, "local", str(run_dir_of(spec, workdir).root))}


def _slurm_task_env(spec: JobSpec, node: int, local: int, job_id: str, tasks_per_node: int) -> dict[str, str]:
    nodes = spec.nodes
    nodelist = f"node[0-{nodes - 1}]" if nodes > 1 else "node0"
    layout = f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node)
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOBID": job_id,
        "SLURM_STEP_ID": "0",
        "SLURM_JOB_NAME": spec.run_id,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_NTASKS": str(nodes * tasks_per_node),
        "SLURM_STEP_NUM_TASKS": str(nodes * tasks_per_node),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_TASKS_PER_NODE": layout,
        "SLURM_STEP_TASKS_PER_NODE": layout,
        "SLURM_PROCID": str(node * tasks_per_node + local),
        "SLURM_LOCALID": str(local),
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": f"node{node}",
        "SLURM_CPUS_PER_TASK": str(spec.cpus_per_task),
        "SLURM_RESTART_COUNT": "0",
    }


def _launched(argv: list[str]) -> list[str]:
    # The per-task launcher exports torch's env:// variables and a thread count, then execs argv;
    # it also makes `python3` the interpreter that runs dist-jobs, whatever PATH says.
    return [sys.executable, "-m", "dist_jobs.launch", "--", *argv]


def plan(spec: JobSpec, workdir: Path, port: int, job_id: str, use_gpus: bool) -> list[LocalProc]:
    """The processes of the job, pure: the same spec and arguments give the same plan."""
    common = _common_env(spec, workdir, port, use_gpus)
    procs: list[LocalProc] = []
    if spec.launcher == "srun":
        for node in range(spec.nodes):
            for local in range(spec.procs):
                env = {**common, **_slurm_task_env(spec, node, local, job_id, spec.procs)}
                procs.append(LocalProc(f"rank {node * spec.procs + local}", _launched(spec.argv), env))
        return procs
    for node in range(spec.nodes):
        argv = [
            sys.executable,
            "-m",
            TORCHRUN_MODULE,
            f"--nnodes={spec.nodes}",
            f"--nproc-per-node={spec.procs}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={MASTER}:{port}",
            f"--rdzv-id={job_id}",
            "--tee=3",
            *torchrun_tail(_launched(spec.argv)),  # every worker through the launcher, as on SLURM
        ]
        env = {**common, **_slurm_task_env(spec, node, 0, job_id, 1)}
        procs.append(LocalProc(f"node {node}", argv, env))
    return procs


class LocalRunner:
    name = "local"

    def __init__(
        self,
        out: TextIO | None = None,
        workdir: Path | None = None,
        missing: MissingPackages = missing_packages,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`missing`: which packages the ranks' python (this one) cannot import (tests replace it);
        `clock`: the time a snapshot's folder is named for."""
        self.out = out or sys.stdout
        self.workdir = workdir or Path.cwd()
        self.missing = missing
        self.clock = clock

    @staticmethod
    def _gpu_mode(spec: JobSpec) -> tuple[bool, str]:
        """Whether the ranks get GPUs, and the notice to print when the machine has too few."""
        gpus = visible_gpus()
        if spec.gpus_per_node and gpus >= spec.gpus_per_node:
            return True, ""
        note = ""
        if spec.gpus_per_node:
            note = (
                f"dist-jobs: the job asks for {spec.gpus_per_node} GPUs per node and this machine has {gpus}: "
                f"running {spec.procs} CPU processes per node with gloo instead"
            )
        return False, note

    def prepare(self, spec: JobSpec) -> Prepared:
        """The plan of processes; with `snapshot`, of the spec that runs from the copy of the code
        that submit (or run) makes, its folder planned here, in `<run dir>/local/`."""
        spec, code = self._planned(spec)
        use_gpus, _ = self._gpu_mode(spec)
        lines = [
            f"# {p.label}: {sh_argv(p.argv)}\n#   env: "
            + " ".join(f"{k}={v}" for k, v in sorted(p.env.items()) if k not in spec.env)
            + "\n"
            for p in plan(spec, self.workdir, 29500, "local", use_gpus)
        ]
        return Prepared("local", spec, "".join(lines), "local-plan.txt", run_dir_of(spec, self.workdir), code)

    def run(self, spec: JobSpec) -> int:
        """Run to completion under the run directory's lock; the exit code is procs.py (0, 200
        preempted and checkpointed, 128+N stopped by signal N, or the first failure's code)."""
        check_trainer_packages(spec, sys.executable, self.missing)  # every rank runs this python
        use_gpus, note = self._gpu_mode(spec)
        if note:
            print(note, file=self.out, flush=True)
        job_id = str(os.getpid())
        spec, workdir = self._code(spec)
        run_dir = made(run_dir_of(spec, workdir), spec).path
        me = Holder.this(new_token(), "", "local", "")  # no owner: only this launcher is this run
        group: ProcessGroup | None = None
        gone: list[str] = []  # the lock's loss, heard between two groups of a restart

        def lost(holder: Holder | None) -> None:
            if holder is not None:
                now = holder.describe()
            elif os.path.exists(run_dir / LOCK_NAME):  # False too where the filesystem fails us
                now = "a run whose record cannot be read"
            else:
                now = "nobody: the lock file was removed"
            gone.append(f"lost the lock of {run_dir} (it is now held by {now}): ending this run without a checkpoint")
            if group is not None:
                group.end_now(gone[-1])

        with held(run_dir, me, on_lost=lost) as lock:
            if lock.took_over:
                print(f"dist-jobs: took over the lock of {run_dir}: {lock.took_over}", file=self.out, flush=True)
            token = {"DIST_JOBS_LOCK_TOKEN": lock.token}  # the trainer joins our lock instead of taking its own
            restart, port = 0, free_port()
            while True:
                group = self._group(spec, run_dir, spec.preemption.max_restarts - restart, lock)
                if gone:  # lost between two groups of a restart: this one ends at once, exit 6
                    group.end_now(gone[-1])
                procs = plan(spec, workdir, port, job_id, use_gpus)
                code = group.run([(p.label, p.argv, {**os.environ, **p.env, **token}) for p in procs], cwd=workdir)
                verdict = replace(group.verdict or decide(Evidence(code)), attempt=f"0.{restart}" if restart else "0")
                record(run_dir, job_id, replace(verdict, time=time.time(), stamp=lock.fence().stamp))
                if verdict.action is not Action.RESTART or gone:
                    break
                restart, port = restart + 1, free_port()  # a fresh rendezvous port: the last may linger
                print(
                    f"dist-jobs: restarting in place: restart {restart} of at most {spec.preemption.max_restarts}",
                    file=self.out,
                    flush=True,
                )
        return code

    def _code(self, spec: JobSpec) -> tuple[JobSpec, Path]:
        """The spec and the folder its ranks start in: with `snapshot`, a copy of the code (made
        by `submit`, or now for a foreground run, as prepare() plans it), else the workdir."""
        if not spec.snapshot:
            return spec, self.workdir
        spec, code = self._planned(spec)
        if code is not None:
            take(code)
        return spec, Path(spec.workdir or self.workdir)

    def _planned(self, spec: JobSpec) -> tuple[JobSpec, SnapshotPlan | None]:
        """`spec` as it runs, and the copy of the code it runs from where one is to be made
        (snapshot.planned), in `<run dir>/local/`."""
        return planned(spec, self.workdir, run_dir_of(spec, self.workdir).path.resolve() / "local", self.clock())

    def _group(self, spec: JobSpec, run_dir: Path, restarts_left: int, lock: Lock) -> ProcessGroup:
        """The ranks' group; what the run directory says of their end is this lock's holder's only."""
        stamp = lock.fence().stamp
        group = ProcessGroup(
            self.out,
            grace=spec.preemption.grace_seconds,
            stop_signal=signal.Signals["SIG" + step_signal(spec)],
            preempted=lambda since: preempted_since(run_dir, since, stamp),
            hung=lambda since: _hang_since(run_dir, since, stamp),
            still_ours=lock.beat,
        )
        group.restarts_left = restarts_left
        return group


def _hang_since(run_dir: Path, since: float, stamp: str) -> str:
    """The hang record's sentence when a rank's watchdog of this lock left it since `since`, else ""."""
    found = attempt_hang(run_dir, since, stamp)
    return describe_hang(found) if found is not None else ""
