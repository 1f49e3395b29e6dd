"""torch's Flight Recorder, kept for a hang: c10d's ring of each process group's recent
collectives (which one, its sequence number, sizes, state), recorded by torch on every rank.

`armed()` holds while a run trains, from before its process group exists, because torch reads its
settings then: it turns the recorder on (TORCH_FR_BUFFER_SIZE entries, as torchtitan does by
default; a size the user set, 0 included, is theirs) and points torch's own dumps (NCCL's dump on a
collective timeout) into the run directory instead of /tmp. When the hang watchdog fires, `dump()`
writes this rank's trace there too (the one prefix armed() set) from the watchdog's thread (taking
only the recorder's lock, so a training thread stuck in a collective does not block it), in torch's
own format, one file per rank:

    <run dir>/flight-recorder/<job>-attempt<N>/rank<R>

which torch's analyser reads for NCCL (`python -m torch.distributed.flight_recorder.fr_trace
<that folder> --prefix rank --allow-incomplete-ranks`): the ranks whose traces stop at an earlier
collective, and the one whose trace is missing (a process that stopped dumps nothing), are the
ones the others wait for. gloo's traces are the same pickle, which that analyser does not read yet
(torch 2.14: gloo names its process group differently in the trace's config than in its entries).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("dist_jobs.train")

FOLDER = "flight-recorder"
PREFIX = "rank"
# Entries per process group: the newest collectives of the last steps (a DDP step enqueues one per
# gradient bucket), a few hundred KB at most.
ENTRIES = 2000
SIZE_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # the newer name, the one before 2.7
DUMP_FILE_VAR = "TORCH_FR_DUMP_TEMP_FILE"  # torch's own dumps: this prefix + the rank


def traces_folder(run_dir: Path, job: str, attempt: int) -> Path:
    """Where an attempt's ranks leave their traces: one folder per attempt, so that torch's
    analyser never mixes one attempt's ranks with another's."""
    return run_dir / FOLDER / f"{job or 'run'}-attempt{attempt}"


@contextmanager
def armed(
    run_dir: Path | None, job: str, attempt: int, environ: MutableMapping[str, str] | None = None
) -> Iterator[None]:
    """While a run trains, from before its process group exists (torch reads its settings then):
    the recorder on unless the user sized it (its cost per collective is below what
    BENCHMARKS.md can measure), and, where it records, torch's own dumps aimed at this attempt's
    folder unless the user chose another. On the way out the environment is as it was, so that
    neither a process this one starts later (a notebook's local job, whose ranks would dump into
    this run's folder) nor this process's next run takes these values for the user's."""
    env = os.environ if environ is None else environ
    before = {name: env.get(name) for name in (SIZE_VARS[0], DUMP_FILE_VAR)}
    if not any(name in env for name in SIZE_VARS):
        env[SIZE_VARS[0]] = str(ENTRIES)
    if run_dir is not None and recording(env) and DUMP_FILE_VAR not in env:
        env[DUMP_FILE_VAR] = str(traces_folder(run_dir, job, attempt) / PREFIX)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value


def recording(environ: Mapping[str, str] | None = None) -> bool:
    """Whether torch records (a size above 0 in the first of its variables that is set)."""
    env = os.environ if environ is None else environ
    size = next((env[name].strip() for name in SIZE_VARS if name in env), "0")
    return size.isdigit() and int(size) > 0


def dump(rank: int, backend: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """Write this rank's trace (NCCL's on GPU, gloo's on CPU) where torch's own dump would go,
    the prefix armed() aimed (or the user chose) plus the rank, beside the other ranks' of the
    attempt; None when there is nothing to write (recorder off, no prefix, a torch without it).
    Never raises: the watchdog's exit matters more than the trace."""
    env = os.environ if environ is None else environ
    prefix = env.get(DUMP_FILE_VAR, "")
    if not recording(env) or not prefix:
        return None
    path = Path(f"{prefix}{rank}")
    try:
        from torch._C import _distributed_c10d as c10d  # a torch built without distributed lacks it

        take = getattr(c10d, "_dump_nccl_trace" if backend == "nccl" else "_dump_fr_trace")
        data = take(includeCollectives=True, includeStackTraces=True, onlyActive=False)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(data)
        partial.replace(path)  # torch's analyser never reads half a trace
        return path
    except (ImportError, AttributeError, RuntimeError, OSError) as exc:
        log.warning("rank %d: the flight recorder's trace was not written: %s", rank, exc)
        return None


def how_to_read(trace: Path, backend: str) -> str:
    """What the rank's log adds after the trace's path: torch's analyser for NCCL's traces, with
    the ranks whose trace is missing allowed for (a stopped rank leaves none). gloo's traces name
    their process group differently in their config than in their entries, which that analyser
    does not read (torch 2.14), so for them: the format, for pickle."""
    if backend != "nccl":
        return " (torch's Flight Recorder format: a pickle)"
    tool = "python -m torch.distributed.flight_recorder.fr_trace"
    return f" (read it with: {tool} {trace.parent} --prefix {PREFIX} --allow-incomplete-ranks)"
