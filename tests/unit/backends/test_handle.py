"""One job handle on every backend: handle strings, the normalised state, wait, result.json."""

from __future__ import annotations

import dataclasses
import importlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import dist_jobs
from dist_jobs.api.job import Job, JobInfo, WaitTimeout, info_of
from dist_jobs.backends import parse_handle
from dist_jobs.backends.base import JobStatus
from dist_jobs.backends.handle import Handle
from dist_jobs.backends.jobstate import JobState, describe_exit, normalise
from dist_jobs.errors import BackendError, DistJobsError, UsageError
from dist_jobs.rundir.result import read_result, write_result
from support.paths import PYTHON, REPO
from support.waiting import HUNG_S


@pytest.mark.parametrize(
    "text, parsed",
    [
        ("slurm://distjobs/123", Handle("slurm", "123", cluster="distjobs")),
        ("slurm://c/77_3", Handle("slurm", "77_3", cluster="c")),
        ("k8s://ml/PyTorchJob/ddp", Handle("k8s", "ddp", namespace="ml", kind="PyTorchJob")),
        ("k8s://default/TrainJob/t1", Handle("k8s", "t1", namespace="default", kind="TrainJob")),
        ("local:///runs/checkpoints/r1", Handle("local", "/runs/checkpoints/r1")),
    ],
)
def test_handles_round_trip(text: str, parsed: Handle) -> None:
    assert parse_handle(text) == parsed
    assert str(parsed) == text


@pytest.mark.parametrize(
    "text", ["123", "slurm://123", "slurm://c/abc", "k8s://ns/Job/x", "k8s://ns/name", "local://relative", "x://a/b"]
)
def test_a_bad_handle_says_which_forms_exist(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_handle(text)
    assert text in caught.value.message and caught.value.hint
    assert "PyTorchJob" in caught.value.hint or "slurm://CLUSTER/ID" in caught.value.hint


@pytest.mark.parametrize(
    "word, state",
    [
        ("PENDING", JobState.PENDING),
        ("RUNNING", JobState.RUNNING),
        ("COMPLETING", JobState.COMPLETING),  # ended, its nodes being cleaned up: no rank runs
        ("COMPLETED", JobState.SUCCEEDED),
        ("CANCELLED by 0", JobState.CANCELLED),
        ("CANCELLED+", JobState.CANCELLED),
        ("TIMEOUT", JobState.FAILED),
        ("OUT_OF_MEMORY", JobState.FAILED),
        ("REQUEUED", JobState.REQUEUED),
        ("Succeeded", JobState.SUCCEEDED),
        ("Failed", JobState.FAILED),
        ("Created", JobState.PENDING),
        ("Terminating", JobState.CANCELLED),
        ("SOMETHING_NEW", JobState.UNKNOWN),
    ],
)
def test_every_schedulers_word_has_a_normalised_state(word: str, state: JobState) -> None:
    assert normalise(word) is state


def test_exit_codes_are_decoded() -> None:
    assert describe_exit(3) == "exit 3"
    assert describe_exit(137) == "killed by SIGKILL (exit 137)"
    assert describe_exit(143) == "killed by SIGTERM (exit 143)"
    assert describe_exit(200) == "exit 200 (asked to run again)"
    assert describe_exit(0, 9) == "killed by SIGKILL"
    assert describe_exit(None) == "no exit code"


class Scripted:
    """A backend whose status walks through `words`, then stays at the last."""

    name = "slurm"

    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.asked = 0
        self.cancelled: list[str] = []

    def status(self, job_id: str) -> JobStatus:
        word = self.words[min(self.asked, len(self.words) - 1)]
        self.asked += 1
        return JobStatus(job_id, "run", word, "exit 3" if word == "FAILED" else "", ranks={1: "exit 3"})

    def logs(self, job_id: str, rank: int | None = None, follow: bool = False) -> Iterator[str]:
        yield from [f"line of rank {rank}"]

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)

    def handle(self, job_id: str) -> Handle:
        return Handle("slurm", job_id, cluster="c1")

    def run_dir(self, job_id: str) -> Path:
        raise BackendError(f"job {job_id} was not submitted from here", "attach from where you submitted it")

    def owner(self, job_id: str) -> str | None:
        return None


def test_wait_polls_until_the_job_ends_and_status_keeps_the_schedulers_word() -> None:
    backend = Scripted(["PENDING", "RUNNING", "RUNNING", "FAILED"])
    job = Job(backend.handle("42"), backend)
    info = job.wait(poll=0.0)
    assert (info.state, info.word, info.detail, info.ranks) == (JobState.FAILED, "FAILED", "exit 3", {1: "exit 3"})
    assert backend.asked == 4
    assert job.handle == "slurm://c1/42" and repr(job) == "Job('slurm://c1/42')"
    assert info.to_dict()["state"] == "failed" and info.to_dict()["ranks"] == {"1": "exit 3"}


def test_wait_times_out_with_the_state_it_saw() -> None:
    job = Job(Handle("slurm", "42", cluster="c"), Scripted(["RUNNING"]))
    with pytest.raises(WaitTimeout) as caught:
        job.wait(timeout=0.2, poll=0.05)
    assert "still running after 0.2 s" in caught.value.message and caught.value.exit_code == 4


def test_follow_merges_every_rank_with_a_prefix() -> None:
    job = Job(Handle("slurm", "42", cluster="c"), Scripted(["RUNNING"]))
    assert sorted(job.follow([0, 1, 2])) == [f"[rank {r}] line of rank {r}" for r in range(3)]


def test_result_is_written_atomically_and_read_back(tmp_path: Path) -> None:
    with pytest.raises(DistJobsError) as caught:
        read_result(tmp_path)
    assert "no result" in caught.value.message and caught.value.hint
    write_result(tmp_path / "run", {"loss": 0.5, "step": 8.0})
    assert read_result(tmp_path / "run") == {"loss": 0.5, "step": 8.0}
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["result.json"]  # no temporary left


def test_the_package_exports_the_job_api_lazily() -> None:
    assert {"submit", "attach", "list_jobs", "Job", "JobState"} <= set(dist_jobs.__all__)
    assert dist_jobs.JobState.SUCCEEDED.finished and not dist_jobs.JobState.REQUEUED.finished


def dj(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=cwd, timeout=HUNG_S)


def test_a_bare_id_without_backend_is_a_usage_error() -> None:
    proc = dj("status", "12345")
    assert proc.returncode == 2 and "which backend" in proc.stderr and "slurm://CLUSTER/ID" in proc.stderr


def test_bash_completion_knows_every_verb_and_flag() -> None:
    proc = dj("completion", "bash")
    assert proc.returncode == 0
    script = proc.stdout
    assert "complete -o filenames -F _dist_jobs dist-jobs" in script
    assert "render submit run status cancel logs plot wait list env schema completion" in script
    submit = next(line for line in script.splitlines() if line.strip().startswith("submit)"))
    assert "--wait" in submit and "--follow" in submit and "--max-requeues" in submit and "--record" not in submit
    bash = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert bash.returncode == 0, bash.stderr


def test_submit_help_groups_flags_by_topic() -> None:
    out = dj("submit", "--help").stdout
    out = out[out.index("job flags") :]
    sections = ["job flags", "SLURM flags", "Kubernetes flags", "training flags", "preemption flags"]
    positions = [out.index(s) for s in sections]
    assert positions == sorted(positions)
    assert out.index("--partition") > out.index("SLURM flags") > out.index("--nodes")
    assert out.index("--max-requeues") > out.index("preemption flags")


def test_env_prints_yaml_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    monkeypatch.setenv("MASTER_PORT", "29511")  # else each call derives its own
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    as_json = json.loads(dj("env", "-o", "json", cwd=tmp_path).stdout)
    assert as_json["master_port"] == 29511
    assert yaml.safe_load(dj("env", "-o", "yaml", cwd=tmp_path).stdout) == as_json
    assert json.loads(dj("env", "--json", cwd=tmp_path).stdout) == as_json


def test_list_gives_every_slurm_job_its_full_handle(tmp_path: Path) -> None:
    fixtures = REPO / "tests" / "fixtures" / "slurm"

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "scontrol":  # asked once for the whole list
            return subprocess.CompletedProcess(argv, 0, "ClusterName             = distjobs\n", "")
        return subprocess.CompletedProcess(argv, 0, (fixtures / "squeue_format.txt").read_text(), "")

    infos = dist_jobs.list_jobs("slurm", runner=runner, jobs_dir=tmp_path)
    assert [i.handle for i in infos][:2] == ["slurm://distjobs/34", "slurm://distjobs/35"]
    assert {i.state for i in infos} <= {JobState.PENDING, JobState.RUNNING}
    assert all(i.detail != "None" for i in infos)


def test_slurm_handles_take_the_cluster_from_slurm_conf_before_scontrol(tmp_path: Path, monkeypatch) -> None:
    from dist_jobs.backends.slurm.backend import SlurmBackend

    conf = tmp_path / "slurm.conf"
    conf.write_text('# ClusterName=commented\nSlurmctldHost=ctl\n  clustername = "Alpha"  # kept lower case\n')
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: the file must answer alone
    assert SlurmBackend(jobs_dir=tmp_path).cluster_name() == "alpha"

    # configless (no file), or set in an Include: scontrol, which knows the running config
    conf.write_text("Include /etc/slurm/more.conf\n")
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho 'ClusterName             = beta'\n")
    (tmp_path / "scontrol").chmod(0o755)
    assert SlurmBackend(jobs_dir=tmp_path).cluster_name() == "beta"
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert SlurmBackend(jobs_dir=tmp_path).cluster_name() == "beta"


class Ended(Scripted):
    """A SLURM-like backend whose job ends with `word` and `detail`; its run directory is `run_dir`,
    where an earlier run of the same name left its result.json."""

    def __init__(self, words: list[str], detail: str, run_dir: Path) -> None:
        super().__init__(words)
        self.detail, self.folder = detail, run_dir

    def status(self, job_id: str) -> JobStatus:
        found = super().status(job_id)
        detail = self.detail if found.state in ("FAILED", "CANCELLED") else ""
        return dataclasses.replace(found, detail=detail, ranks={})

    def run_dir(self, job_id: str) -> Path:
        return self.folder


@pytest.fixture
def stale(tmp_path: Path) -> Path:
    write_result(tmp_path, {"train_loss": 0.01})  # the first run's, still there
    return tmp_path


def test_result_of_a_failed_job_raises_instead_of_returning_an_earlier_runs_metrics(stale: Path) -> None:
    backend = Ended(["RUNNING", "FAILED"], "rank 1 failed first: exit 3 on n2; rank 0: cancelled", stale)
    job = Job(Handle("slurm", "43", cluster="c"), backend)
    with pytest.raises(dist_jobs.JobFailed) as caught:
        job.result(timeout=5)
    failed = caught.value
    assert (failed.state, failed.rank, failed.code, failed.signal) == (JobState.FAILED, 1, 3, None)
    assert failed.exit_code == 1 and "slurm://c/43 failed: rank 1 failed first" in failed.message
    assert "--rank 1" in (failed.hint or "") and backend.asked == 2  # it waited for the end


def test_result_of_a_job_cancelled_before_it_started_raises(stale: Path) -> None:
    backend = Ended(["PENDING", "CANCELLED"], "cancelled while pending: it never started", stale)
    job = Job(Handle("slurm", "44", cluster="c"), backend)
    with pytest.raises(dist_jobs.JobFailed) as caught:
        job.result()
    assert caught.value.state is JobState.CANCELLED and caught.value.exit_code == 3 and caught.value.rank is None


def test_a_signal_is_told_apart_from_an_exit_code(stale: Path) -> None:
    backend = Ended(["FAILED"], "killed by SIGKILL (exit 137)", stale)
    job = Job(Handle("slurm", "45", cluster="c"), backend)
    info = job.wait()  # the default keeps today's behaviour: the final info, no error
    assert info.state is JobState.FAILED
    with pytest.raises(dist_jobs.JobFailed) as caught:
        job.wait(raise_on_failure=True)
    assert (caught.value.code, caught.value.signal) == (137, "SIGKILL")


def test_result_of_a_job_that_succeeded_is_read_after_the_end(stale: Path) -> None:
    job = Job(Handle("slurm", "46", cluster="c"), Ended(["RUNNING", "COMPLETED"], "", stale))
    assert job.result(timeout=5) == {"train_loss": 0.01}


def test_job_state_done_equality_and_a_repr_that_asks_no_scheduler() -> None:
    backend = Scripted(["RUNNING", "COMPLETED"])
    job = Job(Handle("slurm", "42", cluster="c1"), backend)
    assert repr(job) == "Job('slurm://c1/42')" and backend.asked == 0
    assert job.state is JobState.RUNNING and backend.asked == 1
    assert job.done() and backend.asked == 2
    same = Job(backend.handle("42"), backend)  # a bare id: the backend makes its handle
    assert job == same and hash(job) == hash(same) and len({job, same}) == 1
    assert job != Job(Handle("slurm", "43", cluster="c1"), backend)
    assert Job(Handle("slurm", "42", cluster="a"), backend) != same  # another cluster's job 42


def test_the_wait_backs_off_from_two_seconds_to_at_least_ten() -> None:
    from dist_jobs.api.polling import poll_until

    now = [0.0]
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    answers = iter([False] * 9 + [True])
    assert (
        poll_until(lambda: (next(answers), "v"), None, lambda v: AssertionError(v), clock=lambda: now[0], sleep=sleep)
        == "v"
    )
    assert pauses[0] == 2.0 and pauses == sorted(pauses) and pauses[-1] >= 10.0
    assert len(pauses) == 9 and pauses[-1] == pauses[-2]  # capped: a long wait asks at a steady pace


def test_job_wait_and_sweep_wait_share_one_loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from dist_jobs.api import polling, sweep_status

    job_module = importlib.import_module("dist_jobs.api.job")  # dist_jobs.api.job is also a function
    from dist_jobs.api.sweep_status import Sweep

    calls: list[str] = []
    real = polling.poll_until

    def spy(check, timeout, expired, poll=None, **kw):  # type: ignore[no-untyped-def]
        calls.append("poll_until")
        return real(check, timeout, expired, 0.0)

    # Spied on in every module that names it: an import at the top binds the name where it is used.
    for module in (polling, job_module, sweep_status):
        if hasattr(module, "poll_until"):
            monkeypatch.setattr(module, "poll_until", spy)
    Job(Handle("slurm", "42", cluster="c"), Scripted(["RUNNING", "COMPLETED"])).wait()
    sweep = Sweep({"name": "s", "backend": "local", "trials": []}, tmp_path / "sweep.json")
    assert sweep.wait() == []
    assert calls == ["poll_until", "poll_until"]


@pytest.mark.parametrize(
    ("word", "normal", "finished"),
    [("PREEMPTED", "requeued", False), ("PREEMPTED", "", True), ("Terminating", "", True), ("COMPLETING", "", False)],
)
def test_a_backend_status_and_the_api_agree_on_finished(word: str, normal: str, finished: bool) -> None:
    status = JobStatus("7", "run", word, normal=normal)
    assert status.finished is finished
    assert info_of("slurm:7", status).finished is finished


def test_the_package_exports_the_api_names_from_its_one_list() -> None:
    import dist_jobs.api

    assert set(dist_jobs.api.__all__) <= set(dist_jobs.__all__)
    for name in dist_jobs.__all__:
        assert getattr(dist_jobs, name) is not None, name
    assert dist_jobs.attach is dist_jobs.api.attach


def test_job_info_is_a_frozen_hashable_value() -> None:
    info = JobInfo("slurm:7", "run", JobState.RUNNING, "RUNNING", ranks={0: "up"}, extra={"node": "n1"})
    assert hash(info) == hash(JobInfo("slurm:7", "run", JobState.RUNNING, "RUNNING"))  # a set can hold it
    with pytest.raises(AttributeError):
        info.name = "other"  # type: ignore[misc]
