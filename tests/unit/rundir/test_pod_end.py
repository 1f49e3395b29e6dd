"""A pod's verdict (rundir.pod_end) reads the PREEMPTED marker and the HANG record of pod rank 0's
lock only (DIST_JOBS_LOCK_TOKEN): another holder's late one does not make the program preempted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dist_jobs.rundir import pod_end
from dist_jobs.rundir.hang import HangRecord, write_hang, write_preempted
from dist_jobs.rundir.lock import new_token, stamp_of
from dist_jobs.rundir.verdict import recorded


def test_a_late_marker_of_another_holder_is_not_this_pods_preemption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, token = tmp_path / "ckpt" / "run", new_token()
    run_dir.mkdir(parents=True)
    for name, value in {"DIST_JOBS_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "DIST_JOBS_RUN": "run"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DIST_JOBS_SUBMISSION", "pods")
    monkeypatch.setenv("DIST_JOBS_LOCK_TOKEN", token)
    monkeypatch.delenv("DIST_JOBS_LOCK_OWNER", raising=False)
    (tmp_path / "start").touch()
    since = (tmp_path / "start").stat().st_mtime
    old = stamp_of(new_token())
    write_preempted(run_dir, "12", old)
    os.utime(run_dir / "PREEMPTED", (since + 1, since + 1))
    write_hang(run_dir, HangRecord(rank=1, step=12, time=since + 1, stamp=old))
    pod_end.main(["--rc", "1", "--since", str(tmp_path / "start")])
    assert capsys.readouterr().out.strip() == "1"  # the program's own error, not a requeue
    assert recorded(run_dir, "pods")[-1].ending.value not in ("preempted", "hang")
    write_preempted(run_dir, "14", stamp_of(token))
    os.utime(run_dir / "PREEMPTED", (since + 2, since + 2))
    pod_end.main(["--rc", "200", "--since", str(tmp_path / "start")])
    assert capsys.readouterr().out.strip() == "200" and recorded(run_dir, "pods")[-1].ending.value == "preempted"
