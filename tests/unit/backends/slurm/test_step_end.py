"""The batch script's verdict on a step (backends.slurm.step_end) reads the PREEMPTED marker and the
HANG record of its own lock only: a holder that lost the run directory to this job may land one late."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from dist_jobs.backends.slurm.step_end import evidence
from dist_jobs.rundir.hang import HangRecord, write_hang, write_preempted
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lock import acquire, new_token, stamp_of


def test_a_late_marker_and_hang_record_of_the_old_holder_do_not_make_the_step_preempted_or_hung(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    lock = acquire(run_dir, Holder.this(new_token(), "slurm:1024", "slurm", "1024"))
    (tmp_path / "start").touch()
    since = (tmp_path / "start").stat().st_mtime
    old = stamp_of(new_token())  # the holder this job took the run directory over from
    write_preempted(run_dir, "12", old)
    write_hang(run_dir, HangRecord(rank=1, step=12, time=since + 1, stamp=old))
    os.utime(run_dir / "PREEMPTED", (since + 1, since + 1))  # landed after this step started
    args = argparse.Namespace(
        rc=1, errors=tmp_path / "srun.err", since=tmp_path / "start", run_dir=run_dir, token=lock.token
    )
    args.warned = args.cancelled = args.tasks_are_nodes = False
    ev = evidence(args)
    assert (ev.preempted, ev.hang, ev.lock_lost) == (False, "", False)
    write_preempted(run_dir, "14", stamp_of(lock.token))  # this job's own
    os.utime(run_dir / "PREEMPTED", (since + 2, since + 2))
    assert evidence(args).preempted
