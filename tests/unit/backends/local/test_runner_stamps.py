"""The local launcher holds the run directory's lock itself: its ranks' end reads the PREEMPTED
marker and the HANG record of that lock only, not a late one of the holder it took the folder from."""

from __future__ import annotations

import io
import os
from pathlib import Path

from dist_jobs.backends.local.runner import LocalRunner
from dist_jobs.rundir.hang import HangRecord, write_hang, write_preempted
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lock import acquire, new_token, stamp_of
from dist_jobs.spec.load import load_spec


def test_the_launchers_group_reads_only_its_own_locks_marker_and_hang_record(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    lock = acquire(run_dir, Holder.this(new_token(), "", "local", ""))
    spec = load_spec(data={"name": "stamps", "procs_per_node": 1, "checkpoint_dir": str(tmp_path)})
    group = LocalRunner(out=io.StringIO(), workdir=tmp_path)._group(spec, run_dir, 0, lock)
    assert group.preempted is not None and group.hung is not None
    old = stamp_of(new_token())
    write_preempted(run_dir, "12", old)
    os.utime(run_dir / "PREEMPTED", (2000.0, 2000.0))
    write_hang(run_dir, HangRecord(rank=1, step=12, time=2000.0, stamp=old))
    assert not group.preempted(1000.0) and group.hung(1000.0) == ""  # newer than the start, but not ours
    write_preempted(run_dir, "14", stamp_of(lock.token))
    write_hang(run_dir, HangRecord(rank=0, step=14, time=2001.0, stamp=stamp_of(lock.token)))
    assert group.preempted(1000.0) and group.hung(1000.0) == "hang (rank 0)"
