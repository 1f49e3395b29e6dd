"""Live progress: progress.json and metrics.jsonl (rundir.progress, train.live), Job.progress() and
`dist-jobs status` showing it on the local, SLURM and Kubernetes backends, and `status --follow`."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.api.job import Job, JobInfo
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.jobstate import JobState
from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.cli.output import info_table
from dist_jobs.rundir.history import HISTORY, append_history
from dist_jobs.rundir.progress import (
    PROGRESS,
    describe,
    read_history,
    read_progress,
    write_progress,
)
from dist_jobs.train.live import Live, attempt_number, progress_owner
from support.paths import PYTHON
from support.tiers import require_module
from support.waiting import HUNG_S, eventually

RECORD: dict[str, Any] = {
    "step": 40,
    "total_steps": 100,
    "epoch": 1,
    "metrics": {"loss": 0.4123, "lr": 0.1},
    "samples_per_s": 1234.5,
    "eta_s": 125.0,
    "checkpoint_step": 30,
    "attempt": 1,
    "time": time.time() + 86400.0,  # as good as written now, however long the tests take
    "state": "running",
}


def test_progress_is_replaced_atomically_and_read_back(tmp_path: Path) -> None:
    assert read_progress(tmp_path / "run") is None  # nothing yet
    write_progress(tmp_path / "run", RECORD)
    write_progress(tmp_path / "run", {**RECORD, "step": 41})
    assert read_progress(tmp_path / "run") == {**RECORD, "step": 41}
    assert [p.name for p in (tmp_path / "run").iterdir()] == [PROGRESS]  # no temporary left


@pytest.mark.parametrize("text", ["", '{"step": 4', "[1, 2]", '{"step": "4"}', "\x00\xff"])
def test_a_half_written_or_foreign_progress_file_reads_as_none(tmp_path: Path, text: str) -> None:
    (tmp_path / PROGRESS).write_text(text, errors="surrogateescape")
    assert read_progress(tmp_path) is None


def test_history_skips_a_torn_last_line(tmp_path: Path) -> None:
    assert read_history(tmp_path) == []
    append_history(tmp_path, {"step": 10, "epoch": 0, "time": 1.0, "metrics": {"loss": 1.0}})
    append_history(tmp_path, {"step": 20, "epoch": 0, "time": 2.0, "metrics": {"loss": 0.5}})
    with open(tmp_path / HISTORY, "a") as fh:
        fh.write('{"step": 30, "epoch": 0, "ti')  # a writer killed mid-line
    assert [row["step"] for row in read_history(tmp_path)] == [10, 20]


def test_describe_is_one_line_with_every_field() -> None:
    line = describe(RECORD)
    assert line == (
        "step 40/100 (40%) epoch 1  loss 0.4123 lr 0.1  1234 samples/s  eta 2m05s  checkpoint 30  attempt 1"
    )
    done = describe({**RECORD, "step": 100, "state": "finished", "checkpoint_step": None, "eta_s": 0.0})
    assert (
        done.startswith("step 100/100 (100%)")
        and "eta" not in done
        and done.endswith("checkpoint -  attempt 1  finished")
    )


def test_live_writes_progress_and_history_with_an_eta(tmp_path: Path) -> None:
    ticks = iter([100.0, 105.0, 110.0, 115.0])  # the clock at start and at each update
    live = Live(tmp_path, total_steps=100, attempt=2, clock=lambda: next(ticks))
    live.start(0)
    live.update(10, 0, {"loss": 2.0, "lr": 0.1, "samples": 640.0, "samples_per_s": 500.0})
    live.checkpoint_step = 10
    live.update(20, 1, {"eval_loss": 1.5})
    got = read_progress(tmp_path)
    assert got is not None
    assert got["metrics"] == {"loss": 2.0, "lr": 0.1, "eval_loss": 1.5}  # the latest of each
    assert (got["step"], got["total_steps"], got["epoch"], got["attempt"]) == (20, 100, 1, 2)
    assert (got["samples_per_s"], got["checkpoint_step"], got["state"]) == (500.0, 10, "running")
    assert got["eta_s"] == 40.0  # 80 steps left at the last interval's pace: 10 steps in 5 s
    assert [r["metrics"] for r in read_history(tmp_path)] == [{"loss": 2.0, "lr": 0.1}, {"eval_loss": 1.5}]
    live.update(100, 4, {}, finished=True)
    assert (read_progress(tmp_path) or {})["state"] == "finished"
    assert len(read_history(tmp_path)) == 2  # no metrics, no row


def test_live_without_a_folder_writes_nothing_and_an_unwritable_one_does_not_stop_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    writes: list[object] = []
    with monkeypatch.context() as patch:
        patch.chdir(tmp_path)  # a relative path would land here
        patch.setattr("dist_jobs.train.live.write_progress", lambda folder, record: writes.append(folder))
        patch.setattr("dist_jobs.train.live.append_history", lambda folder, row: writes.append(folder))
        Live(None, 10, 0).update(1, 0, {"loss": 1.0})
    assert writes == [] and list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    unwritable = Live(tmp_path / "file" / "run", 10, 0)
    unwritable.update(1, 0, {"loss": 1.0})  # NotADirectoryError: logged only
    unwritable.update(2, 0, {"loss": 0.5})  # and training goes on, warned once
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress: cannot write")]
    assert len(warned) == 1 and str(tmp_path / "file" / "run") in warned[0], caplog.text
    assert list(tmp_path.iterdir()) == [tmp_path / "file"] and (tmp_path / "file").read_text() == ""


def test_attempt_counts_slurm_restarts() -> None:
    assert attempt_number({"SLURM_RESTART_COUNT": "2"}) == 2
    assert attempt_number({}) == 0


# --- Job.status() on every backend --------------------------------------------------------------


def _local_job(tmp_path: Path, pid: int) -> Path:
    run = tmp_path / "checkpoints" / "r1"
    (run / "local").mkdir(parents=True)
    (run / "local" / "pid").write_text(f"{pid}\n")
    return run


@pytest.fixture()
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    # A live pid whose command line names dist_jobs: what a running local job looks like.
    proc = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(120)", "dist_jobs"])
    eventually(
        lambda: b"dist_jobs" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(),  # exec'd yet?
        timeout=HUNG_S,
        interval=0.01,
        what="the sleeper's exec",
    )
    yield proc
    proc.kill()
    proc.wait()


def test_a_running_job_whose_progress_went_quiet_shows_no_eta(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    """The scheduler still says RUNNING (a node died, srun waits for it; a rank hangs), but the
    record is older than 3 of its own intervals and 30 s: no ETA, and how long it is quiet."""
    run = _local_job(tmp_path, sleeper.pid)
    job = Job(Handle("local", str(run)), LocalBackend())
    write_progress(run, {**RECORD, "time": time.time() - 200.0, "every_s": 5.0})
    info = job.status()
    assert info.state is JobState.RUNNING and info.progress is not None
    assert info.progress["eta_s"] is None and 199 < info.progress["quiet_s"] < 260
    assert "eta" not in describe(info.progress) and "no progress for 3m2" in describe(info.progress)
    write_progress(run, {**RECORD, "time": time.time() - 200.0, "every_s": 100.0})  # its own pace
    assert job.status().progress["eta_s"] == 125.0  # type: ignore[index]


def test_local_status_carries_the_progress(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    run = _local_job(tmp_path, sleeper.pid)
    job = Job(Handle("local", str(run)), LocalBackend())
    assert job.status().progress is None  # before the first log interval
    write_progress(run, RECORD)
    info = job.status()
    assert (info.state, info.progress) == (JobState.RUNNING, RECORD)
    assert info.to_dict()["progress"] == RECORD
    assert info_table(info).splitlines()[-1] == f"  progress: {describe(RECORD)}"


def test_slurm_status_reads_the_run_dir_recorded_at_submit(tmp_path: Path) -> None:
    from dist_jobs.backends.slurm.backend import SlurmBackend
    from dist_jobs.spec.load import load_spec

    squeue = "38|RUNNING|None|2|n[1-2]|0:01|UNLIMITED|2026-11-22T05:22:45|2026-11-22T05:22:56|debug|1|fx\n"
    answers = {"sbatch": "38\n", "squeue": squeue}

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, answers[argv[0]], "")

    slurm = SlurmBackend(runner=runner, jobs_dir=tmp_path / "runs", cwd=tmp_path, cluster="c")
    spec = load_spec(data={"name": "fx", "nodes": 2, "procs_per_node": 2, "checkpoint_dir": "ck"})
    assert str(slurm.schedule(slurm.prepare(spec))) == "slurm://c/38"
    job = Job(Handle("slurm", "38", cluster="c"), slurm)
    assert job.progress() is None
    write_progress(tmp_path / "ck" / spec.run_id, RECORD)
    assert job.status().progress == RECORD
    assert Job(Handle("slurm", "39", cluster="c"), slurm).progress() is None  # not submitted from here


def _two_slurm_jobs(tmp_path: Path) -> tuple[Job, Job, Path]:
    """Jobs 38 and 39, submitted from here with one spec: they share a run directory."""
    from dist_jobs.backends.slurm.backend import SlurmBackend
    from dist_jobs.spec.load import load_spec

    ids = iter(["38\n", "39\n"])

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sbatch":
            return subprocess.CompletedProcess(argv, 0, next(ids), "")
        job = argv[argv.index("--jobs") + 1]
        line = f"{job}|RUNNING|None|2|n[1-2]|0:01|UNLIMITED|2026-11-22T05:22:45|2026-11-22T05:22:56|debug|0|fx\n"
        return subprocess.CompletedProcess(argv, 0, line, "")

    slurm = SlurmBackend(runner=runner, jobs_dir=tmp_path / "runs", cwd=tmp_path, cluster="c")
    spec = load_spec(data={"name": "fx", "nodes": 2, "procs_per_node": 2, "checkpoint_dir": "ck"})
    assert [slurm.schedule(slurm.prepare(spec)).job_id for _ in range(2)] == ["38", "39"]
    jobs = [Job(Handle("slurm", i, cluster="c"), slurm) for i in ("38", "39")]
    return jobs[0], jobs[1], tmp_path / "ck" / spec.run_id


def test_progress_is_shown_only_to_the_job_that_wrote_it(tmp_path: Path) -> None:
    """Job 38 was refused (or died) while 39 holds the run directory: 38 shows no counter of 39's."""
    refused, live, run = _two_slurm_jobs(tmp_path)
    mine = {**RECORD, "owner": "slurm:39"}
    write_progress(run, mine)
    assert refused.status().progress is None and refused.progress() is None
    assert live.status().progress == mine
    assert "progress" in info_table(live.status()) and "progress" not in info_table(refused.status())
    write_progress(run, RECORD)  # written by an older trainer: no owner, shown as before
    assert refused.status().progress == RECORD == live.status().progress


def test_progress_names_the_newest_committed_checkpoint(tmp_path: Path) -> None:
    """progress.json is written at log intervals: a checkpoint committed after the last one is newer."""
    _, job, run = _two_slurm_jobs(tmp_path)
    write_progress(run, {**RECORD, "owner": "slurm:39"})  # checkpoint_step 30
    (run / "step-40").mkdir()
    (run / "step-40" / "COMPLETE").write_text("{}\n")
    (run / "step-50").mkdir()  # no COMPLETE: being written, it does not count
    progress = job.status().progress
    assert progress is not None and progress["checkpoint_step"] == 40
    assert "  checkpoint 40  " in info_table(job.status())
    write_progress(run, {**RECORD, "checkpoint_step": 60})  # newer than any folder (pruned): kept
    assert (job.progress() or {})["checkpoint_step"] == 60


def test_live_records_the_job_that_writes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert progress_owner({"SLURM_JOB_ID": "7"}) == "slurm:7"
    array = {"SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "10", "SLURM_ARRAY_TASK_ID": "2"}
    assert progress_owner(array) == "slurm:10_2"  # as its handle names it
    pod = {"DIST_JOBS_LOCK_OWNER": "k8s:pytorchjob/ml/fx", "SLURM_JOB_ID": "7"}
    assert progress_owner(pod) == "k8s:pytorchjob/ml/fx"
    assert progress_owner({"SLURM_JOB_ID": "7", "DIST_JOBS_BACKEND": "local"}) == ""  # local: its run dir
    for name in ("DIST_JOBS_LOCK_OWNER", "DIST_JOBS_BACKEND", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "5")
    Live(tmp_path, 10, 0).update(1, 0, {"loss": 1.0})
    assert (read_progress(tmp_path) or {})["owner"] == "slurm:5"


def test_k8s_status_reads_the_run_dir_the_pods_are_given(tmp_path: Path) -> None:
    require_module("kubernetes")
    from dist_jobs.backends.k8s import client as k8s_client
    from dist_jobs.backends.k8s.backend import K8sBackend
    from dist_jobs.spec.load import load_spec
    from support.k8s_offline.validate import crd_path
    from support.kube_standin import FakeKubeAPI

    data = {
        "name": "fx",
        "nodes": 2,
        "gpus_per_node": 1,
        "image": "reg.example/t:1",
        "checkpoint_dir": str(tmp_path / "ck"),
    }
    with FakeKubeAPI([crd_path("PyTorchJob"), crd_path("TrainJob")]) as api:
        k8s = K8sBackend(api_client=k8s_client.for_host(api.url))
        name = k8s.schedule(k8s.prepare(load_spec(data={**data, "k8s": {"pvc": "ckpt"}}))).job_id
        job = Job(Handle("k8s", name, namespace="default", kind="PyTorchJob"), k8s)
        assert k8s.run_dir(name) == tmp_path / "ck" / name
        assert job.status().progress is None  # nothing there yet (or a volume this host lacks)
        write_progress(tmp_path / "ck" / name, RECORD)
        assert job.progress() == RECORD
        assert job.status().progress == {**RECORD, "eta_s": None}  # no pod runs yet: no ETA
        assert k8s.owner(name) == f"k8s:pytorchjob/default/{name}"  # what its pods write
        write_progress(tmp_path / "ck" / name, {**RECORD, "owner": k8s.owner(name)})
        assert job.progress() == {**RECORD, "owner": k8s.owner(name)}
        write_progress(tmp_path / "ck" / name, {**RECORD, "owner": "k8s:pytorchjob/default/other"})
        assert job.progress() is None  # another job's, sharing the run directory
        trainer = K8sBackend(api_client=k8s_client.for_host(api.url), kind="TrainJob", namespace="ml")
        spec = load_spec(data={**data, "name": "tj", "k8s": {"api": "trainjob", "namespace": "ml", "pvc": "ckpt"}})
        tj = trainer.schedule(trainer.prepare(spec)).job_id
        assert trainer.run_dir(tj) == tmp_path / "ck" / tj


# --- dist-jobs status [--follow] ----------------------------------------------------------------


def dj(*args: str, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [PYTHON, "-m", "dist_jobs", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def test_status_prints_the_progress_line_and_json(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    run = _local_job(tmp_path, sleeper.pid)
    write_progress(run, RECORD)
    out, err = dj("status", f"local://{run}").communicate(timeout=HUNG_S)
    assert f"  progress: {describe(RECORD)}" in out.splitlines(), err
    out, err = dj("status", f"local://{run}", "-o", "json").communicate(timeout=HUNG_S)
    assert json.loads(out)["progress"] == RECORD


def test_follow_refreshes_until_the_job_ends(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    run = _local_job(tmp_path, sleeper.pid)
    write_progress(run, RECORD)
    follow = dj("status", f"local://{run}", "--follow", "--interval", "0.2")
    assert follow.stdout is not None
    assert "running (RUNNING)" in follow.stdout.readline()
    write_progress(run, {**RECORD, "step": 90})
    eventually(
        follow.stdout.readline,
        until=lambda line: "step 90/100" in line,
        timeout=HUNG_S,
        interval=0,
        what="--follow to show the new progress",
    )
    (run / "local" / "exit_code").write_text("0\n")
    out, err = follow.communicate(timeout=HUNG_S)
    assert follow.returncode == 0, err
    assert "succeeded (COMPLETED)" in out.splitlines()[-2]  # the last table: the state, then progress


def test_follow_ends_cleanly_on_ctrl_c(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    run = _local_job(tmp_path, sleeper.pid)
    # As a terminal starts it: Ctrl-C at its default. A process started with SIGINT ignored keeps
    # it ignored (Python installs no KeyboardInterrupt then), and an xdist worker may hand that on.
    default = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
    follow = dj("status", f"local://{run}", "--follow", "--interval", "0.2", preexec_fn=default)
    assert follow.stdout is not None and "running" in follow.stdout.readline()
    follow.send_signal(signal.SIGINT)
    out, err = follow.communicate(timeout=HUNG_S)
    assert follow.returncode == 130 and "Traceback" not in err and "interrupted" in err


def test_follow_refuses_a_non_positive_interval(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    run = _local_job(tmp_path, sleeper.pid)
    follow = dj("status", f"local://{run}", "--follow", "--interval", "0")
    out, err = follow.communicate(timeout=HUNG_S)
    assert follow.returncode == 2 and "--interval 0" in err and "Traceback" not in err


def test_status_help_explains_follow() -> None:
    out, _ = dj("status", "--help").communicate(timeout=HUNG_S)
    assert "--follow" in out and "--interval" in out


def test_an_info_without_progress_has_no_progress_line() -> None:
    info = JobInfo("local:///x", "x", JobState.RUNNING, "RUNNING")
    assert "progress" not in info_table(info)
