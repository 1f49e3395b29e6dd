"""Who holds a run directory's lock, and whether that holder can be proven gone.

A holder is a process (the local launcher, the batch shell of a SLURM job, a pod's entrypoint,
or the trainer's rank 0) and the job it runs for. Two facts decide a takeover without waiting
for its heartbeat to go stale: the same `owner` (a requeued attempt of the same SLURM job, a
replaced pod of the same PyTorchJob) and, on this very machine, a holder process that is no
longer running. "This very machine" needs the host name, the boot id and the pid namespace to
match: a pid means nothing on another host, after a reboot or in another container.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

from dist_jobs.envnum import env_seconds

HEARTBEAT_SECONDS = 10.0

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
# squeue's states of a job whose processes may still run (or, suspended, run again); any other
# state, or a job squeue no longer knows, means none of its processes holds anything.
_SLURM_LIVE = frozenset({"RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "STAGE_OUT", "SIGNALING", "RESIZING"})


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def boot_id() -> str:
    return _read(_BOOT_ID)


def pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat after its "(comm)": state, ppid, ..., start time; [] when no such process."""
    text = _read(f"/proc/{pid}/stat")
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it.
    return text[text.rfind(")") + 2 :].split() if text else []


def process_start(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart), or None
    when no such process runs: gone, or a zombie waiting to be reaped."""
    fields = stat_fields(pid)
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def running(pid: int, start: int | None) -> bool:
    """Whether process `pid` of this machine, started at `start` (process_start; None: not
    known), still runs: not gone, not a zombie, not a later process given the same pid. Where
    there is no /proc (macOS), a live pid is the best that is known."""
    if not os.path.exists("/proc/self/stat"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process
            return True
        return True
    now = process_start(pid)
    return now is not None and start in (None, now)


def heartbeat_seconds(environ: Mapping[str, str] | None = None) -> float:
    """How often a holder touches its lock: DIST_JOBS_LOCK_HEARTBEAT_SECONDS, default 10 s."""
    return env_seconds("DIST_JOBS_LOCK_HEARTBEAT_SECONDS", HEARTBEAT_SECONDS, environ)


def owner_from_env(environ: Mapping[str, str]) -> str:
    """What identifies this job across its attempts: DIST_JOBS_LOCK_OWNER where the backend sets
    it (Kubernetes: k8s:KIND/NAMESPACE/NAME of the PyTorchJob or TrainJob), else the SLURM job id, else nothing."""
    explicit = environ.get("DIST_JOBS_LOCK_OWNER", "").strip()
    if explicit:
        return explicit
    job = environ.get("SLURM_JOB_ID", "").strip()
    if job and environ.get("DIST_JOBS_BACKEND", "").strip() != "local":  # local plays SLURM with fake ids
        return f"slurm:{job}"
    return ""


def attempt_from_env(environ: Mapping[str, str]) -> str:
    """Which attempt of its SLURM job this is: SLURM's requeue count, "0" for the first start."""
    return environ.get("SLURM_RESTART_COUNT", "").strip() or "0"


@dataclass(frozen=True)
class Holder:
    token: str  # one per acquisition: what a heartbeat and a release check before touching the lock
    owner: str  # the job across attempts ("slurm:1234", "k8s:ns/name"); "" matches nothing
    host: str
    pid: int
    pid_start: int | None
    boot_id: str
    pid_ns: str
    backend: str
    job_id: str
    started: float  # unix time
    every: float = HEARTBEAT_SECONDS  # its heartbeat's period: how long a newcomer watches for a beat
    cluster: str = ""  # SLURM_CLUSTER_NAME: whose squeue may be asked about job_id
    attempt: str = ""  # which attempt of its SLURM job (attempt_from_env); "" elsewhere

    @classmethod
    def this(
        cls, token: str, owner: str, backend: str, job_id: str, pid: int | None = None, every: float | None = None
    ) -> Holder:
        """This machine's process `pid` (default: this process) holding the lock for `owner`."""
        pid = os.getpid() if pid is None else pid
        return cls(
            token=token,
            owner=owner,
            host=socket.gethostname(),
            pid=pid,
            pid_start=process_start(pid),
            boot_id=boot_id(),
            pid_ns=pid_namespace(),
            backend=backend,
            job_id=job_id,
            started=time.time(),
            every=heartbeat_seconds() if every is None else every,
            cluster=os.environ.get("SLURM_CLUSTER_NAME", "") if owner.startswith("slurm:") else "",
            attempt=attempt_from_env(os.environ) if owner.startswith("slurm:") else "",
        )

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        """None for a file that is not a holder record (torn, foreign). Fields a later version
        added are left out: an older reader still names the holder and sees it beat."""
        try:
            data = json.loads(raw.decode())
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in known}) if isinstance(data, dict) else None
        except (ValueError, TypeError, AttributeError):
            return None

    def on_this_machine(self) -> bool:
        here = (socket.gethostname(), boot_id(), pid_namespace())
        return bool(self.boot_id) and (self.host, self.boot_id, self.pid_ns) == here

    def gone(self) -> bool:
        """True only when provably not running: on this machine, its process is not there."""
        if not self.on_this_machine():
            return False
        return not running(self.pid, self.pid_start)

    def slurm_state(self) -> str | None:
        """SLURM's word for the holder's job ("GONE" once squeue no longer knows it), or None when
        it cannot be asked: not a SLURM job, no squeue here, or another cluster's job (a job id
        means nothing to another cluster's controller)."""
        here = os.environ.get("SLURM_CLUSTER_NAME", "")
        if not self.owner.startswith("slurm:") or not self.cluster or self.cluster != here:
            return None
        if shutil.which("squeue") is None:
            return None
        argv = ["squeue", "--noheader", "--jobs", self.owner[6:], "--format", "%T"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        if proc.returncode != 0:
            return "GONE" if "Invalid job id" in proc.stderr else None
        states = proc.stdout.split()
        return states[0] if states else "GONE"

    def job_ended(self) -> str | None:
        """SLURM's word when the scheduler says the holder's job runs no process any more."""
        state = self.slurm_state()
        return state if state is not None and state not in _SLURM_LIVE else None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        job = f"{self.backend} job {self.job_id}" if self.job_id else f"{self.backend} run"
        job += f" (attempt {self.attempt})" if self.attempt not in ("", "0") else ""
        return f"{job}, pid {self.pid} on host {self.host}, started {when}"

    def later_attempt_of(self, other: Holder) -> bool:
        """Whether this holder is another attempt of `other`'s job: the job's steps are its now."""
        return bool(self.owner) and self.owner == other.owner and self.token != other.token

    def stop_hint(self) -> str:
        """How to stop this holder's run, in its scheduler's words."""
        if self.owner.startswith("slurm:"):  # the batch script, or a trainer under SLURM (submitit)
            return f"scancel {self.owner[6:]}"
        parts = self.owner.split(":", 1)[-1].split("/")
        if self.owner.startswith("k8s:") and len(parts) == 3:  # k8s:KIND/NAMESPACE/NAME
            return f"kubectl delete {parts[0]} {parts[2]} -n {parts[1]}"
        return f"kill -TERM {self.pid} on host {self.host}"
