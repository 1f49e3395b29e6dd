"""The sbatch/squeue/sacct parsers on the live local cluster: the same commands as the captured
fixtures of tests/unit/backends/slurm/test_squeue_sacct.py (tests/fixtures/slurm/INDEX.md), run for real."""

from __future__ import annotations

import subprocess

from dist_jobs.backends.slurm.sbatch import parse_sbatch_job_id, sbatch_error
from dist_jobs.backends.slurm.squeue_sacct import (
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    SQUEUE_FORMAT_LONG,
    SacctJobState,
    parse_sacct,
    parse_squeue,
    sacct_job_state,
)
from support.tiers import requires
from support.waiting import HUNG_S, eventually

pytestmark = requires("slurm")


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=HUNG_S)


def test_parsers_on_the_live_cluster() -> None:
    bad = run(["sbatch", "-p", "no-such-partition", "--wrap", "true"])
    assert "no partition 'no-such-partition'" in sbatch_error(bad.stderr, bad.returncode).message
    sub = run(["sbatch", "--parsable", "--hold", "-J", "live|test", "-o", "/dev/null", "--wrap", "true"])
    assert sub.returncode == 0, sub.stderr
    job_id = parse_sbatch_job_id(sub.stdout)
    try:
        for fmt, flag in ((SQUEUE_FORMAT, "--format"), (SQUEUE_FORMAT_LONG, "--Format")):
            out = run(["squeue", "--noheader", "--jobs", job_id, flag, fmt])
            (job,) = parse_squeue(out.stdout, fmt)
            assert (job.job_id, job.name, job.state, job.reason) == (job_id, "live|test", "PENDING", "JobHeldUser")
    finally:
        run(["scancel", job_id])

    def accounted() -> SacctJobState | None:
        acct = run(["sacct", "--parsable2", "--noheader", "--duplicates", "--jobs", job_id, "--format", SACCT_FIELDS])
        return sacct_job_state(parse_sacct(acct.stdout), job_id)

    state = eventually(
        accounted,
        # For a few seconds slurmdbd may still show the placeholder name "allocation".
        until=lambda state: state is not None and state.state == "CANCELLED" and state.name == "live|test",
        timeout=30,
        interval=0.5,
        what=f"sacct to show job {job_id} as CANCELLED",
    )
    assert state is not None and state.state_detail.startswith("by ") and state.attempts == 1
