"""Where a SLURM job's folders are is recorded once at submit (dist_jobs.backends.records): its
status reads the same from any folder, not only from the one it was submitted from."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from dist_jobs.backends import records
from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.spec.load import load_spec
from support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "slurm"
SPEC = {"name": "paused", "nodes": 1, "procs_per_node": 1, "time": "10", "log_dir": "logs", "checkpoint_dir": "ck"}
# sacct of job 29 after its script exited 6 (sacct_failed.txt's rows with job 29's id, name and code)
SACCT_29 = (
    "29|29|FAILED|6:0|2026-11-26T13:01:10|2026-11-26T13:01:10|2026-11-26T13:05:02|00:03:52|1|n1|debug|paused\n"
    "29.batch|29.batch|FAILED|6:0|2026-11-26T13:01:10|2026-11-26T13:01:10|2026-11-26T13:05:02|00:03:52|1|n1||batch\n"
)


def cluster(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """sbatch gives job 29; squeue has forgotten it since; sacct has its end."""
    answers = {
        "sbatch": (0, "29\n", ""),
        "squeue": (1, "", (FIXTURES / "squeue_err_unknown_job.txt").read_text()),
        "sacct": (0, SACCT_29, ""),
    }
    return subprocess.CompletedProcess(argv, *answers[argv[0]])


def no_missing(names: Sequence[str]) -> list[str]:
    return []


def test_status_of_a_job_that_lost_its_lock_reads_the_same_from_any_folder(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    slurm = SlurmBackend(runner=cluster, cwd=project, cluster="c", missing_packages=no_missing)
    spec = load_spec(data=SPEC)
    job_id = slurm.submit(slurm.prepare(spec)).job_id
    (project / "logs" / "paused-29.out").write_text((FIXTURES / "batchlog_lock_lost.txt").read_text())
    here = slurm.status(job_id)
    assert (here.state, here.detail) == (
        "FAILED",
        "lost the run directory lock to another run (now held by slurm job 30, pid 18313 on host n2, "
        "started 2026-11-26 13:03:56): stopped without writing more (exit 6)",
    )
    (tmp_path / "elsewhere").mkdir()
    elsewhere = SlurmBackend(runner=cluster, cwd=tmp_path / "elsewhere", cluster="c")
    assert (elsewhere.status(job_id).state, elsewhere.status(job_id).detail) == (here.state, here.detail)
    assert elsewhere.run_dir(job_id) == project / "ck" / "paused"


def test_submit_records_the_absolute_run_and_log_folders_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    slurm = SlurmBackend(runner=cluster, cwd=tmp_path, jobs_dir=runs, cluster="c", missing_packages=no_missing)
    spec = load_spec(data=SPEC)
    prepared = slurm.prepare(spec)
    assert prepared.run_dir is not None and prepared.run_dir.path == tmp_path / "ck" / "paused"
    slurm.submit(prepared)
    found = records.recorded("slurm", "29")
    assert found is not None
    assert (found.run_dir, found.log_dir) == (str(tmp_path / "ck" / "paused"), str(tmp_path / "logs"))
    assert Path(found.job_dir).is_absolute() and (Path(found.job_dir) / "job.json").is_file()
    assert [job.job_id for job in records.every("slurm")] == ["29"]
