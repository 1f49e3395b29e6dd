"""Crash-safe checkpoints for DDP training: `<dir>/step-<N>/` counts only once `COMPLETE` is in it.

Write protocol (each file: temporary name, flush, fsync, rename; directories fsynced after renames):
every rank writes `rank-<r>.pt` into `.step-<N>.<stamp>.partial/`, rank 0 also `shared.pt`; rank 0
polls until every rank's file exists (no collective, so it also works from a background thread),
writes `COMPLETE` (sizes + CRC32 of every file) last and renames the folder to `step-<N>`; a
thread of its own then replaces `latest` and prunes (unlinking old checkpoints need not hold up
training; wait() and the next save() finish it). A crash at any point leaves the previous
complete checkpoint as the newest that counts.

Fencing at the storage: every write is preceded by the run's fence, but a write that passed it
and then stalled (SIGSTOP, a suspended job, an NFS stall) may land after another run took the run
directory over. So the partial folder carries the holder's stamp (rundir.lock.Fence.stamp): a
late rank file lands in the old holder's folder, which the new one never reads or counts as
"already saved"; and a commit never moves a committed step aside (only a copy this rank found
damaged): a late commit of a step the new holder committed drops itself.

Resuming: each rank verifies only the files it loads (`shared.pt` and its own), and the ranks
agree with one all_reduce per checkpoint tried whether all of them could, so a bad part on any
rank makes every rank fall back to the same older checkpoint. A rank opens a constant number of
files, whatever the world size (read.py's marker format). A rank file may list other files its
rank wrote (a sharded checkpoint's DCP files) with their size and CRC32: that rank checks them
too, and in a smaller world than the one that wrote it, rank r also those of ranks r + W, r + 2W...

Loads use `torch.load(weights_only=True)` only (unpickling runs code): save() refuses the rest.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dist_jobs.constants import VERSION
from dist_jobs.rundir.atomic import fsync_dir, open_dir
from dist_jobs.rundir.checkpoints import COMPLETE, LATEST, committed_steps
from dist_jobs.rundir.lock import LockLost
from dist_jobs.train.checkpoint import write as disk
from dist_jobs.train.checkpoint.read import (
    FILES,
    SHARED,
    Agree,
    encode_marker,
    load_verified,
    newest_agreed,
    read_marker,
    unusable,
    verify_files,
)
from dist_jobs.train.checkpoint.write import BackgroundWriter, CheckpointError, TensorBuffers, prepare_state

__all__ = ["COMPLETE", "Agree", "CheckpointError", "Checkpointer", "Loaded"]

log = logging.getLogger(__name__)

_PARTIAL_RE = re.compile(r"^\.step-(\d+)\.(?:[0-9a-f]+\.)?(partial|corrupt-\d+)$")
_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(frozen=True)
class Loaded:
    """What latest() found. rank_state is None for a rank the saving world did not have."""

    step: int
    path: Path
    shared: dict
    rank_state: dict | None
    world_size: int


class Checkpointer:
    """One per rank. Construct it on every rank before training starts: rank 0's constructor
    removes partial folders left by an earlier (crashed) incarnation, which must happen before
    any rank of this incarnation writes into them (the first all-reduce orders that).

    A committed step is immutable: saving it again is a no-op, unless latest() on this rank
    found it damaged, in which case it is rewritten (so call latest() on every rank or none).
    """

    def __init__(
        self,
        directory: Path,
        *,
        rank: int,
        world_size: int,
        keep: int = 3,
        async_write: bool = False,
        finalize_timeout: float = 600.0,
        fence: Callable[[str], None] = lambda doing: None,
        stamp: str = "",
    ) -> None:
        if not 0 <= rank < world_size:
            raise CheckpointError(
                f"rank {rank} is outside world size {world_size}",
                hint="pass the global rank and world size of this process",
            )
        if keep < 2:
            raise CheckpointError(
                f"keep={keep}: at least 2 checkpoints must be kept",
                hint="the previous checkpoint is the fallback if the newest is bad",
            )
        self.directory, self.rank, self.world_size = Path(directory), rank, world_size
        self.keep, self.async_write, self.finalize_timeout = keep, async_write, finalize_timeout
        # Raises (LockLost) once this run no longer holds its run directory: called right before
        # each write, so a run that lost it writes nothing more there.
        self.fence = fence
        self.stamp = stamp  # the holder's mark on its partial folders (hex; "" without a lock)
        self._writer = BackgroundWriter(f"checkpoint-writer-rank{rank}")
        # Moving `latest` and deleting old checkpoints (as long as unlinking their files) come after
        # the commit, on a thread: not the training thread's job.
        self._pruner = BackgroundWriter(f"checkpoint-pruner-rank{rank}")
        self._buffers = {"shared": TensorBuffers(), "rank": TensorBuffers()}
        self._bad: set[int] = set()  # committed steps latest() found unusable: save() replaces them
        self._closed = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create checkpoint folder {self.directory}: {exc.strerror}",
                hint="check the path and its permissions",
            ) from exc
        if rank == 0:
            self.fence("remove the leftovers of interrupted checkpoints")
            for stale in self._leftovers(below=None):
                log.info("removing %s left by an interrupted checkpoint", stale)
                disk.remove(stale)

    # -- public API -----------------------------------------------------------------------
    def save(self, step: int, shared: Mapping[str, Any] | None, rank_state: Mapping[str, Any]) -> None:
        """Write this rank's part of checkpoint `step` (rank 0: also `shared`, then commit).

        Async: returns once the tensors are copied into reused CPU buffers; the write finishes on
        a thread (wait() to be sure). Either way, `latest` is moved and older checkpoints are
        pruned on a thread after the commit (wait() finishes that too). Raises at once if the
        state is not weights_only-safe or its tensors alone exceed the free space.
        """
        if self._closed:
            raise CheckpointError("save() after close()", hint="create a new Checkpointer")
        if type(step) is not int or step < 0:
            raise CheckpointError(f"checkpoint step {step!r} is not an int >= 0", hint="pass the optimizer step count")
        self.wait()  # at most one write in flight; surfaces the previous one's error
        if self.rank == 0 and shared is None:
            raise CheckpointError(
                f"rank 0 must pass the shared state for step {step}",
                hint="pass model/optimizer/... state as `shared` on rank 0",
            )
        if self._already_saved(step):
            log.info("checkpoint step-%d is already saved; not writing it again", step)
            return
        snap_shared, needed = self._snapshot("shared", shared) if self.rank == 0 else (None, 0)
        snap_rank, rank_bytes = self._snapshot("rank", rank_state)
        needed += rank_bytes  # a lower bound (tensor bytes only): failing early on it is safe
        free = disk.free_bytes(self.directory)
        if needed > free:
            raise self._disk_full(step, needed, free)
        job = lambda: self._write(step, snap_shared, snap_rank, needed)
        if self.async_write:
            self._writer.submit(job)
        else:
            job()

    def wait(self) -> None:
        """Block until the in-flight write (if any) is durable and pruning done; raise their error."""
        try:
            self._writer.wait()
            self._pruner.wait()
        except (CheckpointError, LockLost):
            raise
        except Exception as exc:
            raise CheckpointError(
                f"background checkpoint write in {self.directory} failed: {exc!r}",
                hint="see the traceback above; the previous checkpoint is intact",
            ) from exc

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.wait()

    def latest(self, agree: Agree | None = None, accept: Callable[[Loaded], object] = lambda _: None) -> Loaded | None:
        """Newest complete checkpoint whose parts verify and load on every rank; bad newer ones
        are logged and skipped. Call it on every rank with `agree` (in a job of one rank, or to
        read a checkpoint outside a job, leave it out: this rank then decides alone).

        `accept` checks the content (missing keys, say) and raises when it cannot be used.
        Usually one all_reduce: read.newest_agreed says how the ranks fall back together.
        """

        def load(step: int) -> Loaded:
            loaded = self._load(step)
            accept(loaded)  # the caller's check of the content: raising makes this one unusable too
            return loaded

        return newest_agreed(sorted(self._committed()), load, self._reject, agree)

    def _reject(self, step: int, got: Loaded | Exception | None) -> None:
        """Every rank marks the same step bad (so all rewrite it); the rank that failed says why."""
        self._bad.add(step)
        if isinstance(got, Exception) or self.rank == 0:
            log.warning("%s", unusable(self._folder(step), self.rank, got if isinstance(got, Exception) else None))

    # -- layout ---------------------------------------------------------------------------
    def _folder(self, step: int) -> Path:
        return self.directory / f"step-{step}"

    def _partial(self, step: int) -> Path:
        return self.directory / (f".step-{step}.{self.stamp}.partial" if self.stamp else f".step-{step}.partial")

    def _committed(self) -> list[int]:
        return committed_steps(self.directory)

    def _leftovers(self, below: int | None) -> list[Path]:
        found = [(int(m.group(1)), m.group(0)) for m in map(_PARTIAL_RE.match, os.listdir(self.directory)) if m]
        return [self.directory / name for step, name in found if below is None or step < below]

    def _already_saved(self, step: int) -> bool:
        # Partial first: rank 0 may move it to step-N between the two checks, never the reverse.
        mine = self._partial(step) / f"rank-{self.rank}.pt"
        if self.rank != 0 and mine.exists():
            return True
        return (self._folder(step) / COMPLETE).is_file() and step not in self._bad

    # -- writing --------------------------------------------------------------------------
    def _snapshot(self, which: str, state: Mapping[str, Any] | None) -> tuple[Any, int]:
        """Async: copy tensors into the reused buffers. Sync: validate; torch.save reads the live ones."""
        nbytes = 0
        buffers = self._buffers[which]

        def visit(path: str, tensor: torch.Tensor) -> torch.Tensor:
            nonlocal nbytes
            nbytes += tensor.numel() * tensor.element_size()
            return buffers.copy(path, tensor) if self.async_write else tensor

        buffers.begin()
        snap = prepare_state(state, which, visit)
        buffers.end()
        return snap, nbytes

    def _write(self, step: int, shared: Any, rank_state: Any, needed: int) -> None:
        partial, files = self._partial(step), {}
        self.fence(f"write rank {self.rank}'s part of checkpoint step-{step}")
        try:
            partial.mkdir(parents=True, exist_ok=True)
            # Opened first: once our file is in, rank 0 may rename the folder before we fsync it.
            with open_dir(partial) as handle:
                if self.rank == 0:
                    files[SHARED] = disk.write_atomic(partial / SHARED, lambda f: torch.save(shared, f))
                # The rank file comes last: it records the size and CRC32 of this rank's other files.
                others = self._write_others(step)
                mine = {**rank_state, FILES: others} if others else rank_state
                name = f"rank-{self.rank}.pt"
                files[name] = disk.write_atomic(partial / name, lambda f: torch.save(mine, f))
                os.fsync(handle)
            if self.rank == 0:
                self._commit(step, files)
        except (CheckpointError, LockLost):
            raise  # a rank missed the deadline, or the folder is another run's now: leave it be
        except Exception as exc:
            if self.rank == 0 and partial.exists():
                disk.remove(partial)  # nothing of a failed step may remain to confuse anyone
            if getattr(exc, "errno", None) in _FULL:
                raise self._disk_full(step, needed, disk.free_bytes(self.directory)) from exc
            raise CheckpointError(
                f"writing checkpoint {self._folder(step)} failed: {exc}",
                hint="check the volume; the previous checkpoint is intact",
            ) from exc

    def _write_others(self, step: int) -> dict[str, dict[str, Any]]:
        """A subclass's files of this rank besides shared.pt and its rank file (sharded state),
        written before the rank file: their size and CRC32 by name, which the rank file records."""
        return {}

    def _commit(self, step: int, files: dict[str, dict[str, Any]]) -> None:
        partial = self._partial(step)
        self._await_ranks(step)
        ranks = [files["rank-0.pt"]] + [disk.digest(partial / f"rank-{r}.pt") for r in range(1, self.world_size)]
        head = {
            "step": step,
            "world_size": self.world_size,
            "version": VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        payload = encode_marker(head, files[SHARED], ranks)
        disk.write_atomic(partial / COMPLETE, lambda f: f.write(payload))  # last file: it makes it count
        fsync_dir(partial)
        final = self._folder(step)
        self.fence(f"commit checkpoint step-{step}")
        if final.exists() and (step in self._bad or not (final / COMPLETE).is_file()):
            aside = self.directory / f".step-{step}.corrupt-{time.time_ns()}"  # a copy that does not count
            os.rename(final, aside)
        if not self._rename_unless_committed(partial, final, step):
            return
        fsync_dir(self.directory)
        self._bad.discard(step)
        self._after_commit(step)

    def _rename_unless_committed(self, partial: Path, final: Path, step: int) -> bool:
        """Commit `partial` as `final`; False, dropping it, where `final` is already committed:
        another run that holds the run directory now committed this step, and this late one must
        not move it aside. (A folder renamed onto a non-empty one fails: the check is the rename.)
        That run's pruner may also have removed this partial folder already (every partial folder
        up to the step it committed goes): the same late commit, with nothing left to drop."""
        try:
            os.rename(partial, final)
            return True
        except OSError as exc:
            late = (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT)
            if exc.errno not in late or not (final / COMPLETE).is_file():
                raise
        log.warning("checkpoint step-%d was committed by another run meanwhile: keeping it, dropping this one", step)
        disk.remove(partial)
        return False

    def _await_ranks(self, step: int) -> None:
        """Poll for every rank's file: no collective, so this works from the writer thread too."""
        partial = self._partial(step)
        expected = {r: partial / f"rank-{r}.pt" for r in range(1, self.world_size)}
        late = disk.wait_for(list(expected.values()), self.finalize_timeout)
        if late:
            missing = [r for r, path in expected.items() if path in late]
            raise CheckpointError(
                f"checkpoint {self._folder(step)}: rank(s) {missing} wrote no file into {partial} "
                f"within {self.finalize_timeout:g}s",
                hint="every rank must call save() for the same step; check those ranks' logs "
                "(crash, full disk, slow storage) or raise finalize_timeout",
            )

    def _after_commit(self, step: int) -> None:
        """Pointer and pruning, on the pruner thread: the checkpoint already counts (dist-jobs
        never reads `latest`; it is for people and tools), so failures only warn, and a lost
        lock is raised by the next wait()."""
        self._pruner.submit(lambda: self._tidy(step))

    def _tidy(self, step: int) -> None:
        self.fence(f"point {LATEST} at step-{step} and prune older checkpoints")
        try:
            payload = f"step-{step}\n".encode()
            disk.write_atomic(self.directory / LATEST, lambda f: f.write(payload))
            fsync_dir(self.directory)
            older = sorted((s for s in self._committed() if s < step), reverse=True)
            doomed = [self._folder(s) for s in older[self.keep - 1 :]] + self._leftovers(below=step + 1)
            for folder in doomed:
                disk.remove(folder)
        except OSError as exc:
            log.warning("checkpoint step-%d is committed, but updating %s or pruning failed: %s", step, LATEST, exc)

    def _disk_full(self, step: int, needed: int, free: int) -> CheckpointError:
        return CheckpointError(
            f"disk full: checkpoint {self._folder(step)} needs at least {needed} bytes "
            f"({needed / 2**20:.1f} MiB) on this rank, {free} bytes are free",
            hint="free space on that volume, lower keep_checkpoints, or point "
            "DIST_JOBS_CHECKPOINT_DIR at a larger volume; the previous checkpoint is intact",
        )

    # -- reading --------------------------------------------------------------------------
    def load(self, step: int) -> Loaded:
        """Committed checkpoint `step` as this rank sees it (verified), outside a job: no agreeing."""
        return self._load(step)

    def _load(self, step: int) -> Loaded:
        """This rank's part only: the marker's header and own record, shared.pt, rank-<r>.pt."""
        folder = self._folder(step)
        marker = read_marker(folder / COMPLETE, self.rank)
        if marker.step != step:
            raise ValueError(f"{COMPLETE} says step {marker.step}")
        shared = load_verified(folder / SHARED, marker.shared)
        mine = None if marker.mine is None else load_verified(folder / f"rank-{self.rank}.pt", marker.mine)
        if isinstance(mine, dict) and FILES in mine:
            verify_files(folder, mine[FILES], f"rank-{self.rank}.pt")
            # A smaller world than the one that wrote it: rank r also checks ranks r + W, r + 2W, ...
            for other in range(self.rank + self.world_size, marker.world_size, self.world_size):
                name = f"rank-{other}.pt"
                theirs = load_verified(folder / name, read_marker(folder / COMPLETE, other).mine or {})
                verify_files(folder, theirs.get(FILES, {}), name)
        return Loaded(step=step, path=folder, shared=shared, rank_state=mine, world_size=marker.world_size)
