"""What a running job tells the outside: rank 0's live progress, and every rank's hang watchdog.

`Live` writes `<run dir>/progress.json` and appends `<run dir>/metrics.jsonl`
(dist_jobs.rundir.progress) at the points the loop already has its numbers: each log interval,
where Meter.reduce() synchronized the ranks anyway, and each epoch's end. It adds no collective
and no GPU sync; other ranks do nothing. The log interval's records are written by a thread of
their own, in order, so the step does not wait for the files (nor its peers for rank 0).
`watchdog()` builds the rank's hang watchdog (dist_jobs.train.watchdog) from the training config,
and its `Beats`: every rank's watchdog thread leaves the rank's beat in the run directory
(dist_jobs.rundir.beats), and the one that fires compares them to name the rank that stopped in
the hang record.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from dist_jobs.rundir.attempts import Attempts
from dist_jobs.rundir.beats import Beat, read_beat, read_beats, stopped, waiting_in, write_beat
from dist_jobs.rundir.hang import HangRecord, StoppedRank, describe_hang, job_id, write_hang, write_preempted
from dist_jobs.rundir.history import append_history
from dist_jobs.rundir.holder import owner_from_env
from dist_jobs.rundir.ledger import note, process_started
from dist_jobs.rundir.progress import write_progress
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train import flight
from dist_jobs.train.checkpoint.write import BackgroundWriter
from dist_jobs.train.distributed import collectives_entered
from dist_jobs.train.runlock import Guard
from dist_jobs.train.watchdog import Watchdog, default_check_every, waits_in

log = logging.getLogger("dist_jobs.train")
# Not metrics of the model: shown as samples_per_s, or not at all.
_NOT_METRICS = frozenset({"samples", "samples_per_s", "epoch", "step"})


def attempt_number(environ: Mapping[str, str] | None = None) -> int:
    """0 for a job's first start, n after n requeues/restarts (SLURM's count, else the run dir's)."""
    env = os.environ if environ is None else environ
    restarts = env.get("SLURM_RESTART_COUNT", "").strip()
    if restarts.isdigit():
        return int(restarts)
    try:  # the pod entrypoint (and the batch script) count each start in the run directory
        return max(Attempts.from_env(env).count() - 1, 0)
    except (ValueError, OSError):
        return 0


def progress_owner(environ: Mapping[str, str] | None = None) -> str:
    """The job that writes progress.json, as `dist-jobs status` names it: `slurm:ID` (an array
    task: `slurm:ARRAY_TASK`, its handle's id), `k8s:KIND/NAMESPACE/NAME`, or "" (a local run, whose
    id is its run directory). Status shows the progress only to the job that wrote it."""
    env = os.environ if environ is None else environ
    owner = owner_from_env(env)
    array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
    return f"slurm:{array}_{task}" if owner.startswith("slurm:") and array and task else owner


class Live:
    """Rank 0's progress.json and metrics.jsonl; every method does nothing when `folder` is None."""

    def __init__(
        self,
        folder: Path | None,
        total_steps: int,
        attempt: int,
        guard: Guard | None = None,
        owner: str | None = None,
        clock: Callable[[], float] = time.monotonic,  # the ETA's pace; a test gives its own
    ) -> None:
        self.folder = folder
        self.clock = clock
        self.guard = guard or Guard()
        self.total = total_steps
        self.attempt = attempt
        self.owner = progress_owner() if owner is None else owner
        self.metrics: dict[str, float] = {}
        self.checkpoint_step: int | None = None
        self._mark: tuple[float, int] | None = None  # (time, step) of the previous update: the ETA's pace
        self._failed = False
        self._rate: float | None = None
        self._written: float | None = None  # when the previous record was made (unix time)
        self._first = False  # the attempt's first step is still to be noted
        self._writer = BackgroundWriter("dist-jobs-progress")  # one write in flight, in order

    def start(self, step: int) -> None:
        """The attempt begins its loop at `step`: the ETA's pace, and the ledger's start (dated
        when this process started, so its imports and rendezvous count as start-up)."""
        self._mark = (self.clock(), step)
        self._first = True
        self._note("start", time=process_started(), attempt=self.attempt, job=job_id(), resumed_step=step)

    def stepped(self, step: int) -> None:
        """After each optimizer step: the ledger notes the attempt's first."""
        if self._first:
            self._first = False
            self._note("first_step", time=time.time(), step=step)

    def saved(self, step: int, blocked_s: float) -> None:
        """A checkpoint save of `step` held the loop for `blocked_s`."""
        self._note("save", time=time.time(), step=step, blocked_s=blocked_s)

    def _note(self, event: str, **fields: object) -> None:
        """One ledger event (dist_jobs.rundir.ledger); like progress, training goes on without it."""
        if self.folder is None or not self.guard.holds(f"note {event} in the ledger"):
            return
        try:
            note(self.folder, event, stamp=self.guard.stamp, **fields)  # a superseded run's late note is dropped
        except OSError as exc:
            log.warning("ledger: cannot write %s: %s (training goes on)", self.folder, exc)

    def update(
        self, step: int, epoch: int, values: Mapping[str, float], *, finished: bool = False, wait: bool = True
    ) -> None:
        """Record `values` (the latest of each metric is kept) and rewrite the progress file.

        `wait=False` (the training loop's log lines) hands the writing to this Live's writer thread
        and returns: rank 0 reading the lock file, appending a row and replacing progress.json
        with its fsyncs would otherwise hold the step, and with it every other rank, which waits
        for rank 0 in the next step's collective. A waiting update (the epoch's end, the finished
        record) lands after every earlier one, in order; so does flush()."""
        if self.folder is None or self.guard.lost.is_set():
            return
        fresh = {k: float(v) for k, v in values.items() if k not in _NOT_METRICS}
        self.metrics.update(fresh)
        now, wall = self.clock(), time.time()
        if "samples_per_s" in values:
            self._rate = float(values["samples_per_s"])
        record: dict[str, object] = {
            "step": step,
            "total_steps": self.total,
            "epoch": epoch,
            "metrics": dict(self.metrics),
            "samples_per_s": self._rate,
            "eta_s": 0.0 if finished else self._eta(now, step),
            "checkpoint_step": self.checkpoint_step,
            "attempt": self.attempt,
            "owner": self.owner,
            "time": wall,
            "every_s": None if self._written is None else wall - self._written,
            "state": "finished" if finished else "running",
            "stamp": self.guard.stamp,  # a late write of ours, once superseded, is not believed
        }
        row = {"step": step, "epoch": epoch, "time": wall, "metrics": fresh, "stamp": self.guard.stamp}
        self._written = wall
        history = ({**row, "owner": self.owner} if self.owner else row) if fresh else None
        if wait:
            self.flush()
            self._write(self.folder, record, history)
        else:
            self._writer.submit(partial(self._logged, self.folder, record, history))

    def _write(self, folder: Path, record: Mapping[str, object], history: Mapping[str, object] | None) -> None:
        """The files themselves, fenced right before they are written (on either thread)."""
        if not self.guard.holds("write progress.json and metrics.jsonl"):
            return
        try:
            if history is not None:
                append_history(folder, history)
            write_progress(folder, record)
        except (OSError, ValueError) as exc:  # progress is for people: training goes on without it
            if not self._failed:
                log.warning("progress: cannot write %s: %s (training goes on)", folder, exc)
            self._failed = True

    def _logged(self, folder: Path, record: Mapping[str, object], history: Mapping[str, object] | None) -> None:
        """_write() on the writer thread: its own errors are handled in it, so one that escapes is a
        bug, logged there; flush() must not raise it into the training step."""
        try:
            self._write(folder, record, history)
        except Exception:
            log.exception("progress: the writer thread's write failed (training goes on)")

    def flush(self) -> None:
        """Wait until every update handed to the writer thread is written (or given up)."""
        self._writer.wait()

    def close(self) -> None:
        """flush(): the writer's thread ends with its last write."""
        self.flush()

    def _eta(self, now: float, step: int) -> float | None:
        mark, self._mark = self._mark, (now, step)
        if mark is None or step <= mark[1]:
            return None
        return (self.total - step) * (now - mark[0]) / (step - mark[1])


def host_name(environ: Mapping[str, str] | None = None) -> str:
    """This rank's node as the scheduler names it (SLURM's node name), else the short host name."""
    env = os.environ if environ is None else environ
    return env.get("SLURMD_NODENAME", "").strip() or socket.gethostname().split(".")[0]


class Beats:
    """This rank's beat file, rewritten from its watchdog thread at most every `every_s`, and
    the comparison of every rank's when the watchdog fires (dist_jobs.rundir.beats).

    `every_s`: an eighth of the hang floor, between one check and 5 s, so a stopped rank's beat
    is stale (`stale_s`: three beats and two checks) well before its peers' watchdogs fire, and
    a rank writes a small file every few seconds, not every step."""

    def __init__(
        self, folder: Path, rank: int, world_size: int, floor_s: float, check_every_s: float, guard: Guard | None = None
    ) -> None:
        self.folder, self.rank, self.world_size = folder, rank, world_size
        self.guard = guard or Guard()
        self.every_s = min(max(floor_s / 8, check_every_s), 5.0)
        self.stale_s = 3 * self.every_s + 2 * check_every_s
        self.host, self.job, self.attempt = host_name(), job_id(), attempt_number()
        self._written: float | None = None  # monotonic time of the last write

    def tick(self, dog: Watchdog) -> None:
        now = time.monotonic()
        if self._written is None or now - self._written >= self.every_s:
            self._written = now
            # The watchdog's thread beats on while the loop runs to its next fence: once this run
            # lost the run directory, it leaves no beat beside the successor's ranks.
            if self.guard.holds(f"leave rank {self.rank}'s beat"):
                self.write(dog)

    def write(self, dog: Watchdog) -> Beat:
        beat = Beat(
            rank=self.rank,
            host=self.host,
            step=dog.step,
            time=time.time(),
            waiting=waits_in(dog.trainer),
            collectives=collectives_entered(),
            attempt=self.attempt,
            job=self.job,
        )
        write_beat(self.folder, beat)
        return beat

    def silence(self) -> tuple[int, float] | None:
        """The rank this one watches (the next, in a ring) and how long ago it left its last beat;
        None alone in the world, or while it has no beat of this attempt."""
        if self.world_size < 2:
            return None
        peer = (self.rank + 1) % self.world_size
        beat = read_beat(self.folder, peer, job=self.job, attempt=self.attempt)
        return None if beat is None else (peer, time.time() - beat.time)

    def record(self, dog: Watchdog) -> HangRecord:
        """The hang record of this rank's firing: every rank's beat compared, this one's fresh."""
        try:
            mine = self.write(dog)
        except OSError:  # the record matters more than this rank's file: compare it all the same
            mine = Beat(self.rank, self.host, dog.step, time.time(), waits_in(dog.trainer), collectives_entered())
        others = read_beats(self.folder, self.world_size, job=self.job, attempt=self.attempt)
        beats = sorted([b for b in others if b.rank != self.rank] + [mine], key=lambda b: b.rank)
        late = stopped(beats, time.time(), self.stale_s)
        return HangRecord(
            rank=self.rank,
            step=dog.step,
            time=time.time(),
            attempt=self.attempt,
            job=self.job,
            host=self.host,
            stopped=tuple(StoppedRank(b.rank, b.host, b.step) for b in late),
            others=waiting_in(beats, late),
            compared=len(beats),
            stamp=self.guard.stamp,
        )


def watchdog(
    config: TrainConfig,
    rank: int,
    folder: Path | None,
    collective_timeout_s: float,
    guard: Guard | None = None,
    world_size: int = 1,
    backend: str = "gloo",
    **options: Any,
) -> Watchdog | None:
    """The rank's hang watchdog (None when train.hang_watchdog is off), firing before a collective
    waits `collective_timeout_s`. Its thread leaves the rank's beat in `folder`; when it fires it
    leaves the hang record status reads (naming the rank that stopped), this rank's flight
    recorder trace (dist_jobs.train.flight), then the marker the batch script and the pod
    entrypoint read as "requeue", as a preemption does. All are fenced by `guard`: a run that lost
    its run directory must not make the run that took it over look hung or requeue it.
    `options`: more of Watchdog's arguments (a test's clock, stream and exit)."""
    if not config.hang_watchdog:
        return None
    every = options.setdefault("check_every_s", default_check_every(config.hang_min_seconds))
    pulse = None if folder is None else Beats(folder, rank, world_size, config.hang_min_seconds, every, guard)

    def mark(dog: Watchdog) -> None:
        if pulse is None:
            return
        pulse.guard.check("leave the hang record and the requeue marker")
        found = pulse.record(dog)
        write_hang(pulse.folder, found)  # first: a status that sees the requeue sees why
        trace = flight.dump(rank, backend)
        write_preempted(pulse.folder, describe_hang(found), pulse.guard.stamp)
        dog.say(describe_hang(found))  # this rank's view; the record keeps the first rank's
        if trace is not None:
            dog.say(f"flight recorder trace: {trace}{flight.how_to_read(trace, backend)}")

    dog = Watchdog(
        config.hang_factor,
        config.hang_min_seconds,
        collective_timeout_s=collective_timeout_s,
        rank=rank,
        on_fire=mark,
        on_tick=None if pulse is None else pulse.tick,
        peer_silence=None if pulse is None else pulse.silence,
        **options,
    )
    if rank == 0:
        _warn_if_capped(config, dog, collective_timeout_s)
    return dog


def _warn_if_capped(config: TrainConfig, dog: Watchdog, collective_timeout_s: float) -> None:
    if dog.cap is not None and config.hang_min_seconds > dog.cap:
        log.warning(
            "train.hang_min_seconds is %gs, too close to the collective timeout of %gs "
            "(train.collective_timeout, $DIST_JOBS_COLLECTIVE_TIMEOUT) for the watchdog to dump the stacks "
            "before it aborts the process: a hang is declared after %.0fs instead; raise "
            "train.collective_timeout or lower train.hang_min_seconds",
            config.hang_min_seconds,
            collective_timeout_s,
            dog.cap,
        )
