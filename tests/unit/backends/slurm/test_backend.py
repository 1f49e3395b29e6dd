"""SlurmBackend through a fake command runner that answers with real captured SLURM output.

The answers come from tests/fixtures/slurm/ (verbatim output of Slurm 22.05, see its INDEX.md);
the few outputs that are not there are quoted inline with the command that produced them on
the local test cluster. Each test checks what the backend asks SLURM (argv) and what it makes
of the answer. tests/integration/test_slurm_cluster.py runs the same verbs against the real cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import yaml

from dist_jobs.backends.handle import Handle
from dist_jobs.backends.slurm.backend import SlurmBackend, run_command
from dist_jobs.backends.slurm.squeue_sacct import SACCT_FIELDS, SQUEUE_FORMAT, SQUEUE_FORMAT_LONG
from dist_jobs.errors import BackendError, UsageError
from dist_jobs.spec import run_id
from dist_jobs.spec.load import load_spec
from support.git_project import make_project
from support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "slurm"
SPEC = {"name": "tiny job", "nodes": 2, "procs_per_node": 2, "time": "10"}
RUN = run_id(str(SPEC["name"]))  # "tiny-job-<hash>": the name has a space
NOON = time.mktime((2026, 11, 28, 12, 0, 0, 0, 0, -1))  # the clock a snapshot's folder is named for
# `scancel --verbose 99999` (no such job) and `scancel --verbose 186` (ended 3 s before): exit 0 both.
SCANCEL_UNKNOWN = (
    "scancel: Terminating job 99999\nscancel: error: Kill job error on job id 99999: Invalid job id specified\n"
)
SCANCEL_ENDED = (
    "scancel: Terminating job 186\n"
    "scancel: error: Kill job error on job id 186: Job/step already completing or completed\n"
)
# `sbatch --test-only --gpus-per-node=4 --wrap true` on the GPU-less cluster (exit 1).
SBATCH_NO_GRES = "sbatch: error: Invalid generic resource (gres) specification\n"
# Trimmed `scontrol show job 185` of a running `sbatch -J fx-show -N2 -o .../fx-show-%j.out` job.
SCONTROL_SHOW_JOB = """JobId=185 JobName=fx-show
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
   NodeList=n[1-2]
   WorkDir={logs}
   StdErr={logs}/fx-show-185.out
   StdIn=/dev/null
   StdOut={logs}/fx-show-185.out
"""

Answer = tuple[int, str, str]  # returncode, stdout, stderr


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


class FakeRunner:
    """Answers each program from a queue (the last answer repeats); records every argv."""

    def __init__(self, **answers: Answer | list[Answer] | Callable[[list[str]], Answer]) -> None:
        self.answers = {
            name: value if isinstance(value, list) or callable(value) else [value] for name, value in answers.items()
        }
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        self.calls.append(list(argv))
        answer = self.answers.get(argv[0])
        if answer is None:
            raise AssertionError(f"unexpected command {argv}")
        if callable(answer):
            code, out, err = answer(argv)
        else:
            code, out, err = answer.pop(0) if len(answer) > 1 else answer[0]
        return subprocess.CompletedProcess(argv, code, out, err)

    def programs(self) -> list[str]:
        return [argv[0] for argv in self.calls]


def backend(tmp_path: Path, runner: FakeRunner, lacks: tuple[str, ...] = ()) -> SlurmBackend:
    """A SLURM backend on `runner` whose python has every package but `lacks` (torch or not here)."""

    def missing(names: Sequence[str]) -> list[str]:
        return [name for name in names if name in lacks]

    return SlurmBackend(runner=runner, jobs_dir=tmp_path / "runs", cwd=tmp_path, cluster="c", missing_packages=missing)


def submit(tmp_path: Path, runner: FakeRunner, lacks: tuple[str, ...] = (), **spec: object) -> tuple[SlurmBackend, str]:
    slurm = backend(tmp_path, runner, lacks)
    return slurm, slurm.schedule(slurm.prepare(load_spec(data={**SPEC, **spec}))).job_id


# --- submit -----------------------------------------------------------------------------------


def test_submit_writes_the_job_dir_and_parses_the_id(tmp_path: Path) -> None:
    seen: dict[str, str] = {}

    def sbatch(argv: list[str]) -> Answer:
        seen["script"] = Path(argv[-1]).read_text()  # what sbatch read, at the moment it read it
        return 0, fixture("sbatch_parsable.txt"), ""

    slurm = backend(tmp_path, FakeRunner(sbatch=sbatch))
    prepared = slurm.prepare(load_spec(data=SPEC))
    assert slurm.schedule(prepared) == Handle("slurm", "26", cluster="c")
    (call,) = slurm.run.calls  # type: ignore[attr-defined]
    assert call[:3] == ["sbatch", "--parsable", f"--chdir={tmp_path}"]
    assert seen["script"] == prepared.payload
    job_dir = tmp_path / "runs" / f"{RUN}-26"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [f"{RUN}-26"]  # no staging left
    assert (job_dir / f"{RUN}.sbatch").read_text() == prepared.payload
    assert load_spec(data=yaml.safe_load((job_dir / "spec.yaml").read_text())) == prepared.spec
    meta = json.loads((job_dir / "job.json").read_text())
    assert meta["job_id"] == "26" and meta["run"] == RUN and meta["launcher"] == "srun"
    assert meta["log_dir"] == str(tmp_path / "logs")
    # slurmd opens --output=logs/... before the script runs: the folder must exist already.
    assert (tmp_path / "logs").is_dir()


def test_job_json_names_the_run_directory_the_trainer_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the trainer expands `~` the same way
    slurm = backend(tmp_path, FakeRunner(sbatch=(0, fixture("sbatch_parsable.txt"), "")))
    for given, want in (("~/ckpts", tmp_path / "home" / "ckpts"), ("ckpts", tmp_path / "ckpts")):
        job_id = slurm.schedule(slurm.prepare(load_spec(data={**SPEC, "checkpoint_dir": given}))).job_id
        meta = json.loads((tmp_path / "runs" / f"{RUN}-{job_id}" / "job.json").read_text())
        assert meta["run_dir"] == str(want / RUN), given


def test_a_job_id_the_cluster_gives_again_keeps_both_records(tmp_path: Path) -> None:
    """Job ids start again when a cluster's state is reset: the new job's record takes the name,
    the earlier one is kept beside it, and the submit does not fail after sbatch took the job."""
    slurm = backend(tmp_path, FakeRunner(sbatch=(0, fixture("sbatch_parsable.txt"), "")))
    for nodes in (1, 2):
        assert slurm.schedule(slurm.prepare(load_spec(data={**SPEC, "nodes": nodes}))).job_id == "26"
    job_dir = tmp_path / "runs" / f"{RUN}-26"
    assert json.loads((job_dir / "job.json").read_text())["nodes"] == 2  # the newer job's
    (before,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith(f"{RUN}-26.before-")]
    assert json.loads((before / "job.json").read_text())["nodes"] == 1


def test_submit_makes_its_own_python_the_jobs_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A job submitted with .venv/bin/dist-jobs from a shell without the venv active: the script's
    # PATH has no dist-jobs, so the submitting interpreter travels as DIST_JOBS_PYTHON.
    monkeypatch.delenv("DIST_JOBS_PYTHON", raising=False)
    slurm, _ = submit(tmp_path, FakeRunner(sbatch=(0, fixture("sbatch_parsable.txt"), "")))
    (call,) = slurm.run.calls  # type: ignore[attr-defined]
    assert f"--export=ALL,DIST_JOBS_PYTHON={sys.executable}" in call
    assert 'DJ_PY="${DIST_JOBS_PYTHON:-python3}"' in (tmp_path / "runs" / f"{RUN}-26" / f"{RUN}.sbatch").read_text()
    # A spec that names the job's python renders it and exports nothing.
    slurm, _ = submit(
        tmp_path / "named",
        FakeRunner(sbatch=(0, fixture("sbatch_parsable.txt"), "")),
        python="/opt/envs/train/bin/python",
    )
    (call,) = slurm.run.calls  # type: ignore[attr-defined]
    assert not [a for a in call if a.startswith("--export")]
    named = tmp_path / "named" / "runs" / f"{RUN}-26" / f"{RUN}.sbatch"
    assert "DJ_PY=/opt/envs/train/bin/python\n" in named.read_text()


def test_submit_refuses_a_python_without_torch_for_the_builtin_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIST_JOBS_PYTHON", raising=False)
    runner = FakeRunner(sbatch=(0, fixture("sbatch_parsable.txt"), ""))
    with pytest.raises(UsageError, match="has no torch") as caught:
        submit(tmp_path, runner, lacks=("torch",))
    assert "dist-jobs[train]" in (caught.value.hint or "")
    assert not runner.calls  # nothing submitted
    # Your own command decides what it needs: no check.
    submit(tmp_path, runner, lacks=("torch",), command=["python3", "train.py"])


def test_submit_refuses_a_python_without_torchvision_for_an_image_model_or_data_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch alone does not run resnet18 on FakeData: every rank would stop at its first import."""
    monkeypatch.delenv("DIST_JOBS_PYTHON", raising=False)
    runner = FakeRunner(sbatch=(0, fixture("sbatch_parsable.txt"), ""))
    for train in ({"model": "resnet18", "data": "fake"}, {"model": "gpt", "data": "cifar10"}):
        with pytest.raises(
            UsageError, match=f"has no torchvision, which the built-in trainer needs for model '{train['model']}'"
        ) as caught:
            submit(tmp_path, runner, lacks=("torchvision",), train=train)
        assert "torch, torchvision" in (caught.value.hint or "")
    assert not runner.calls
    # The language model on its own text data, and a model of the user's on the trainer's own fake
    # images, need torch only.
    submit(tmp_path, runner, lacks=("torchvision",), train={"model": "gpt", "data": "text", "data_root": "/d/t.txt"})
    submit(tmp_path, runner, lacks=("torchvision",), train={"model": "my_models:net", "data": "fake"})
    assert [argv[0] for argv in runner.calls] == ["sbatch", "sbatch"]


def test_submit_with_workdir_keeps_its_chdir_and_logs_there(tmp_path: Path) -> None:
    runner = FakeRunner(sbatch=(0, fixture("sbatch_parsable_cluster.txt"), ""))
    _, job_id = submit(tmp_path, runner, workdir=str(tmp_path / "work"), log_dir="out")
    assert job_id == "27"  # "27;distjobs"
    assert not [a for a in runner.calls[0] if a.startswith("--chdir")]  # the script's #SBATCH --chdir rules
    assert (tmp_path / "work" / "out").is_dir()
    meta = json.loads((tmp_path / "runs" / f"{RUN}-27" / "job.json").read_text())
    assert meta["log_dir"] == str(tmp_path / "work" / "out")


def test_the_dry_run_of_a_snapshot_is_the_script_sbatch_gets_and_the_copy_lands_where_it_named(
    tmp_path: Path,
) -> None:
    proj = make_project(
        tmp_path / "proj", {"train.py": "print('committed')\n"}, {"train.py": "print('as submitted')\n"}
    )
    seen: dict[str, str] = {}

    def sbatch(argv: list[str]) -> Answer:
        seen["script"] = Path(argv[-1]).read_text()
        return 0, fixture("sbatch_parsable.txt"), ""

    runs = tmp_path / "runs"
    slurm = SlurmBackend(
        runner=FakeRunner(sbatch=sbatch), jobs_dir=runs, cwd=proj, cluster="c",
        missing_packages=lambda names: [], clock=lambda: NOON,
    )  # fmt: skip
    spec = load_spec(data={**SPEC, "snapshot": True})
    dry = slurm.prepare(spec)  # what `submit --dry-run` prints
    assert dry.snapshot is not None and not runs.exists()  # the dry run copies nothing
    copy = dry.snapshot.dest
    assert copy == runs / "snapshots" / f"{RUN}-20261128-120000-{os.getpid()}"
    assert f"#SBATCH --chdir={copy}" in dry.payload and dry.spec.workdir == str(copy)
    assert slurm.submit(spec).job_id == "26"
    assert seen["script"] == dry.payload  # the script sbatch got is the dry run's, byte for byte
    assert sorted(p.name for p in (runs / "snapshots").iterdir()) == [copy.name]  # exactly there
    assert (copy / "train.py").read_text() == "print('as submitted')\n"
    job_dir = runs / f"{RUN}-26"
    assert load_spec(data=yaml.safe_load((job_dir / "spec.yaml").read_text())) == dry.spec
    assert json.loads((job_dir / "job.json").read_text())["code"]["dir"] == str(copy)


@pytest.mark.parametrize(
    "fixture_name,message,hint",
    [
        ("sbatch_err_invalid_partition.txt", "SLURM has no partition 'nosuch'", "sinfo -s"),
        ("sbatch_err_too_many_nodes.txt", "more nodes than the partition has", "sinfo -N"),
        ("sbatch_err_too_many_cpus.txt", "more CPUs/tasks requested than the nodes have", "procs_per_node"),
        ("sbatch_err_memory.txt", "Memory specification can not be satisfied", "memory"),
        ("sbatch_err_no_controller.txt", "cannot reach the SLURM controller", "slurm/cluster/up.sh"),
        ("sbatch_err_munge_down.txt", "munge failed", "munge -n"),
    ],
)
def test_sbatch_errors_become_clear_backend_errors(tmp_path: Path, fixture_name: str, message: str, hint: str) -> None:
    # sinfo unanswered: the message falls back to sbatch's own words (test_slurm_limits has sinfo's)
    runner = FakeRunner(sbatch=(1, "", fixture(fixture_name)), sinfo=(1, "", ""))
    with pytest.raises(BackendError) as caught:
        submit(tmp_path, runner)
    assert message in caught.value.message and "sbatch said:" in caught.value.message
    assert hint in (caught.value.hint or "")
    assert not (tmp_path / "runs").exists(), "a failed submit must not leave a job directory"


def test_a_failed_submit_leaves_no_folders_it_made(tmp_path: Path) -> None:
    (tmp_path / "logs-old").mkdir()
    with pytest.raises(BackendError):
        submit(tmp_path, FakeRunner(sbatch=(1, "", fixture("sbatch_err_no_controller.txt"))), log_dir="new/logs")
    with pytest.raises(BackendError):
        submit(tmp_path, FakeRunner(sbatch=(1, "", fixture("sbatch_err_no_controller.txt"))), log_dir="logs-old")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs-old"]  # no runs/, new/ or new/logs


def test_gres_error_names_the_gpu_request(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="GPU request") as caught:
        submit(tmp_path, FakeRunner(sbatch=(1, "", SBATCH_NO_GRES), sinfo=(1, "", "")), gpus_per_node=4)
    assert "sinfo -o '%P %G'" in (caught.value.hint or "")


def test_unparsable_sbatch_output_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="printed no job id"):
        submit(tmp_path, FakeRunner(sbatch=(0, "Submitted batch job 12\n", "")))
    assert not (tmp_path / "runs").exists()


def test_sbatch_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    slurm = SlurmBackend(jobs_dir=tmp_path / "runs", cwd=tmp_path, missing_packages=lambda names: [])
    with pytest.raises(BackendError, match=r"SLURM is not installed here: `sbatch` is not on PATH") as caught:
        slurm.schedule(slurm.prepare(load_spec(data=SPEC)))
    assert "bash slurm/cluster/up.sh" in (caught.value.hint or "")
    assert not (tmp_path / "runs").exists()


def test_runner_timeout_names_the_command() -> None:
    with pytest.raises(BackendError, match=r"`sleep 5` did not answer within 0 s") as caught:
        run_command(["sleep", "5"], timeout=0.2)
    assert "scontrol ping" in (caught.value.hint or "")


# --- status -----------------------------------------------------------------------------------


def test_status_from_squeue_while_known(tmp_path: Path) -> None:
    runner = FakeRunner(squeue=(0, fixture("squeue_requeued_running_long.txt"), ""))
    status = backend(tmp_path, runner).status("38")
    assert (status.job_id, status.name, status.state, status.finished) == ("38", "fx-requeued", "RUNNING", False)
    assert status.extra == {"nodes": "n[1-2]", "time_used": "0:01", "restarts": "1"}
    assert runner.calls == [["squeue", "--noheader", "--jobs", "38", "--Format", SQUEUE_FORMAT_LONG]]


def test_status_of_a_requeued_job_waiting_for_its_begin_time(tmp_path: Path) -> None:
    runner = FakeRunner(squeue=(0, fixture("squeue_requeued_pending_long.txt"), ""))
    status = backend(tmp_path, runner).status("38")
    assert (status.state, status.detail, status.extra["restarts"]) == ("PENDING", "BeginTime", "1")


@pytest.mark.parametrize(
    "sacct,job_id,state,detail,attempts",
    [
        ("sacct_completed.txt", "30", "COMPLETED", "exit 0", "1"),
        ("sacct_completed_just_finished.txt", "30", "COMPLETED", "exit 0", "1"),
        ("sacct_failed.txt", "31", "FAILED", "exit 3", "1"),
        ("sacct_cancelled.txt", "32", "CANCELLED", "cancelled at 2026-11-22 05:22:28", "1"),  # not sacct's 0:0
        ("sacct_timeout.txt", "37", "TIMEOUT", "exit 0", "1"),
        ("sacct_requeued.txt", "38", "COMPLETED", "exit 0", "2"),  # the later attempt wins
        ("sacct_requeued_pending.txt", "38", "REQUEUED", "exit 0", "1"),
    ],
)
def test_status_from_sacct_after_the_job_left_squeue(
    tmp_path: Path, sacct: str, job_id: str, state: str, detail: str, attempts: str
) -> None:
    runner = FakeRunner(squeue=(1, "", fixture("squeue_err_unknown_job.txt")), sacct=(0, fixture(sacct), ""))
    status = backend(tmp_path, runner).status(job_id)
    assert (status.job_id, status.state, status.detail, status.extra["attempts"]) == (job_id, state, detail, attempts)
    assert status.finished == (state != "REQUEUED")
    assert runner.calls[1] == [
        "sacct",
        "--parsable2",
        "--noheader",
        "--duplicates",
        "--jobs",
        job_id,
        "--format",
        SACCT_FIELDS,
    ]


def test_status_of_an_unknown_job(tmp_path: Path) -> None:
    runner = FakeRunner(
        squeue=(1, "", fixture("squeue_err_unknown_job.txt")),
        sacct=(0, fixture("sacct_pending_just_submitted.txt"), ""),
    )
    with pytest.raises(BackendError, match="SLURM knows no job 34") as caught:
        backend(tmp_path, runner).status("34")
    assert "sacct" in (caught.value.hint or "")


def test_status_of_a_job_submitted_here_that_ended_before_slurmdbd_recorded_it(tmp_path: Path) -> None:
    """squeue drops a job the moment it ends; slurmdbd may not have its record yet. A job this
    machine submitted exists: it reads UNKNOWN (the next poll finds it), as in `statuses`, not
    "SLURM knows no job", which ended a `wait` on it."""
    record = tmp_path / "runs" / f"{RUN}-26" / "job.json"  # what submit records
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"job_id": "26", "run": RUN, "log_dir": str(tmp_path / "logs")}))
    runner = FakeRunner(squeue=(1, "", fixture("squeue_err_unknown_job.txt")), sacct=(0, "", ""))
    slurm = backend(tmp_path, runner)
    status = slurm.status("26")
    assert (status.state, status.finished) == ("UNKNOWN", False)
    assert status.detail == "squeue no longer lists it and sacct has no record of it yet"
    assert slurm.statuses(["26"])["26"] == status
    record.unlink()  # an id nobody here submitted
    with pytest.raises(BackendError, match="SLURM knows no job 26"):
        slurm.status("26")


def test_status_with_the_controller_unreachable_says_so(tmp_path: Path) -> None:
    """It once answered "SLURM knows no job" (after squeue's retries and sacct's)."""
    runner = FakeRunner(squeue=(1, "", fixture("squeue_err_no_controller.txt")))
    with pytest.raises(BackendError, match="cannot reach the SLURM controller") as caught:
        backend(tmp_path, runner).status("999999")
    assert "scontrol ping" in (caught.value.hint or "") and runner.programs() == ["squeue"]


def test_status_when_sacct_fails_is_not_an_unknown_job(tmp_path: Path) -> None:
    runner = FakeRunner(
        squeue=(1, "", fixture("squeue_err_unknown_job.txt")),
        sacct=(1, "", "sacct: error: Problem talking to the database: Connection refused\n"),
    )
    with pytest.raises(BackendError, match="sacct failed: .*Connection refused"):
        backend(tmp_path, runner).status("34")


def test_status_while_squeue_knows_the_job_never_asks_sacct(tmp_path: Path) -> None:
    runner = FakeRunner(squeue=(0, fixture("squeue_format_long.txt"), ""))
    status = backend(tmp_path, runner).status("34")
    assert (status.name, status.state, status.detail) == ("fx-pending|pipe name", "PENDING", "Resources")
    assert runner.programs() == ["squeue"]


# --- list, cancel -----------------------------------------------------------------------------


def test_list_reads_squeue(tmp_path: Path) -> None:
    runner = FakeRunner(squeue=(0, fixture("squeue_format.txt"), ""))
    jobs = backend(tmp_path, runner).list()
    assert [(j.job_id, j.name, j.state, j.detail) for j in jobs] == [
        ("34", "fx-pending|pipe name", "PENDING", "Resources"),
        ("35", "fx-pending-2", "PENDING", "Priority"),
        ("36", "fx-held", "PENDING", "JobHeldUser"),
        ("33", "fx-running", "RUNNING", ""),  # squeue's "None" is no reason, not a word to show
    ]
    assert jobs[3].extra == {"nodes": "n[1-2]"}
    argv = runner.calls[0]
    # the uid, not a name from $USER/$LOGNAME (which a shell may set to anything)
    assert argv == ["squeue", "--noheader", "--user", str(os.getuid()), "--format", SQUEUE_FORMAT]


def test_list_fails_clearly_without_a_controller(tmp_path: Path) -> None:
    runner = FakeRunner(squeue=(1, "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n"))
    with pytest.raises(BackendError, match="squeue failed: slurm_load_jobs error: Unable to contact"):
        backend(tmp_path, runner).list()


def test_cancel_asks_scancel(tmp_path: Path) -> None:
    runner = FakeRunner(scancel=(0, "", "scancel: Terminating job 187\n"))
    backend(tmp_path, runner).cancel("187")
    assert runner.calls == [["scancel", "--verbose", "187"]]


@pytest.mark.parametrize(
    "stderr,job_id,message",
    [
        (SCANCEL_UNKNOWN, "99999", "SLURM knows no job 99999"),
        (SCANCEL_ENDED, "186", "job 186 has already ended"),
    ],
)
def test_cancel_of_an_unknown_or_ended_job_is_an_error(tmp_path: Path, stderr: str, job_id: str, message: str) -> None:
    with pytest.raises(BackendError, match=message):
        backend(tmp_path, FakeRunner(scancel=(0, "", stderr))).cancel(job_id)


def test_cancel_of_a_malformed_id(tmp_path: Path) -> None:
    runner = FakeRunner(scancel=(1, "", "scancel: error: Invalid job id 185abc\n"))
    with pytest.raises(BackendError, match="SLURM knows no job 185abc"):
        backend(tmp_path, runner).cancel("185abc")


# --- logs -------------------------------------------------------------------------------------


def write_logs(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)


def test_logs_stitch_attempts_in_order(tmp_path: Path) -> None:
    slurm, job_id = submit(tmp_path, FakeRunner(sbatch=(0, "26\n", "")))
    write_logs(
        tmp_path / "logs",
        {
            f"{RUN}-26-attempt0-rank1.out": "a0 line1\na0 line2\n",
            f"{RUN}-26-attempt10-rank1.out": "a10\n",  # numeric order: 10 comes after 2
            f"{RUN}-26-attempt2-rank1.out": "a2 no newline at the end",
            f"{RUN}-26-attempt0.1-rank1.out": "a0, restarted in place once\n",
            f"{RUN}-26-attempt0-rank11.out": "rank 11, not rank 1\n",
            f"{RUN}-126-attempt0-rank1.out": "job 126, not 26\n",
            f"{RUN}-26-attempt0-rank0.out": "rank 0\n",
            f"{RUN}-26.out": "batch log\n",
        },
    )
    assert list(slurm.logs(job_id, rank=1)) == [
        f"==> {RUN}-26-attempt0-rank1.out <==",
        "a0 line1",
        "a0 line2",
        f"==> {RUN}-26-attempt0.1-rank1.out <==",
        "a0, restarted in place once",
        f"==> {RUN}-26-attempt2-rank1.out <==",
        "a2 no newline at the end",
        f"==> {RUN}-26-attempt10-rank1.out <==",
        "a10",
    ]
    assert list(slurm.logs(job_id, rank=0)) == [f"==> {RUN}-26-attempt0-rank0.out <==", "rank 0"]


def test_logs_in_torchrun_mode_read_the_node_file_of_the_rank(tmp_path: Path) -> None:
    """One SLURM task per node runs torchrun: SLURM's %t in the file name is the node's index."""
    slurm, job_id = submit(tmp_path, FakeRunner(sbatch=(0, "26\n", "")), launcher="torchrun")
    write_logs(
        tmp_path / "logs",
        {f"{RUN}-26-attempt0-rank0.out": "ranks 0 and 1\n", f"{RUN}-26-attempt0-rank1.out": "ranks 2 and 3\n"},
    )
    assert list(slurm.logs(job_id, rank=3))[1:] == ["ranks 2 and 3"]  # an older job's log: no rank prefixes
    assert list(slurm.logs(job_id, rank=1))[1:] == ["ranks 0 and 1"]


def test_logs_in_torchrun_mode_find_a_rank_by_its_prefix_not_the_nodes_file_name(tmp_path: Path) -> None:
    slurm, job_id = submit(tmp_path, FakeRunner(sbatch=(0, "26\n", "")), launcher="torchrun")
    node1 = "torchrun: starting 2 workers\n[rank 2] loss 1.0\n[rank 3] loss 1.1\n[rank 2] done\n"
    write_logs(
        tmp_path / "logs", {f"{RUN}-26-attempt0-rank0.out": "[rank 0] a\n", f"{RUN}-26-attempt0-rank1.out": node1}
    )
    assert list(slurm.logs(job_id, rank=2))[1:] == ["loss 1.0", "done"]
    assert list(slurm.logs(job_id, rank=3))[1:] == ["loss 1.1"]
    every = [line for line in slurm.logs(job_id) if "==>" not in line]
    assert every == [
        "[node 0] [rank 0] a",
        "[node 1] torchrun: starting 2 workers",
        *[f"[node 1] {x}" for x in node1.splitlines()[1:]],
    ]


def test_torchrun_on_slurm_prefixes_every_worker_line_with_its_global_rank() -> None:
    import dist_jobs

    spec = dist_jobs.load_spec(data={"procs_per_node": 2, "nodes": 2, "launcher": "torchrun"})
    script = dist_jobs.api.render(spec, "slurm")
    assert "export PET_TEE=3" in script and "export PET_LOG_LINE_PREFIX_TEMPLATE='[rank ${rank}] '" in script
    srun = dist_jobs.api.render(dist_jobs.load_spec(data={"procs_per_node": 2}), "slurm")
    assert "PET_" not in srun


def test_logs_before_the_job_wrote_any(tmp_path: Path) -> None:
    slurm, job_id = submit(tmp_path, FakeRunner(sbatch=(0, "26\n", "")))
    with pytest.raises(BackendError, match="no logs for job 26 rank 2") as caught:
        list(slurm.logs(job_id, rank=2))
    assert "--follow" in (caught.value.hint or "")


def test_logs_follow_until_the_job_ends(tmp_path: Path) -> None:
    """With --follow, lines written later and a new attempt's file both show up."""
    logs = tmp_path / "logs"
    squeue = [(0, fixture("squeue_requeued_running_long.txt").replace("38|", "26|", 1), "")]

    def job_writes_then_ends(argv: list[str]) -> Answer:
        if squeue:  # first poll: still running; it writes more and starts another attempt
            with (logs / f"{RUN}-26-attempt0-rank0.out").open("a") as fh:
                fh.write("later\n")
            (logs / f"{RUN}-26-attempt1-rank0.out").write_text("resumed\n")
            return squeue.pop()
        return 1, "", fixture("squeue_err_unknown_job.txt")

    sacct = fixture("sacct_completed.txt").replace("30|30|", "26|26|")
    runner = FakeRunner(sbatch=(0, "26\n", ""), squeue=job_writes_then_ends, sacct=(0, sacct, ""))
    slurm, job_id = submit(tmp_path, runner)
    write_logs(logs, {f"{RUN}-26-attempt0-rank0.out": "first\n"})
    assert list(slurm.logs(job_id, follow=True)) == [  # every rank (here one), each line with its rank
        f"[rank 0] ==> {RUN}-26-attempt0-rank0.out <==",
        "[rank 0] first",
        "[rank 0] later",
        f"[rank 0] ==> {RUN}-26-attempt1-rank0.out <==",
        "[rank 0] resumed",
    ]


def test_logs_of_a_job_submitted_elsewhere_found_through_scontrol(tmp_path: Path) -> None:
    logs = tmp_path / "elsewhere" / "logs"
    write_logs(logs, {"fx-show-185-attempt0-rank0.out": "hello\n"})
    runner = FakeRunner(scontrol=(0, SCONTROL_SHOW_JOB.format(logs=logs), ""))
    assert list(backend(tmp_path, runner).logs("185", rank=0))[1:] == ["hello"]
    assert runner.calls == [["scontrol", "show", "job", "185"]]


def test_logs_of_an_unknown_job(tmp_path: Path) -> None:
    runner = FakeRunner(scontrol=(1, "", "slurm_load_jobs error: Invalid job id specified\n"))
    with pytest.raises(BackendError, match="cannot find the log folder of job 99"):
        list(backend(tmp_path, runner).logs("99"))


def test_default_runner_runs_the_program_and_captures_both_streams() -> None:
    proc = run_command(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "out\n", "err\n")


def _array_queue(array: int, running: range, pending: range) -> str:
    """squeue --Format SQUEUE_FORMAT_LONG lines of an array job, as Slurm 22.05 prints them
    (tests/fixtures/slurm/squeue_format_long.txt): running tasks one a line, pending ones folded."""
    lines = [
        f"{array}_{i}|RUNNING|None|1|n1|0:05|UNLIMITED|2026-11-22T05:22:33|2026-11-22T05:22:34|debug|0|sw"
        for i in running
    ]
    lines.append(
        f"{array}_[{pending.start}-{pending.stop - 1}%10]|PENDING|JobArrayTaskLimit|1||0:00|UNLIMITED|"
        "2026-11-22T05:22:33|N/A|debug|0|sw"
    )
    return "\n".join(lines) + "\n"


def _array_acct(array: int, ended: range) -> str:
    """sacct rows (tests/fixtures/slurm/sacct_completed.txt's shape) of ended array tasks; task 3 failed."""
    rows = []
    for i in ended:
        state, code = ("FAILED", "3:0") if i == 3 else ("COMPLETED", "0:0")
        stamp = "2026-11-22T05:22:22"
        rows.append(f"{array}_{i}|{array + 1 + i}|{state}|{code}|{stamp}|{stamp}|{stamp}|00:00:09|1|n1|debug|sw")
        rows.append(
            f"{array}_{i}.batch|{array + 1 + i}.batch|{state}|{code}|{stamp}|{stamp}|{stamp}|00:00:09|1|n1||batch"
        )
    return "\n".join(rows) + "\n"


def test_one_squeue_and_one_sacct_answer_for_a_hundred_array_tasks(tmp_path: Path) -> None:
    from dist_jobs.api.job import Job, statuses
    from dist_jobs.backends.handle import Handle

    calls: list[list[str]] = []

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        out = _array_queue(500, range(5, 10), range(10, 100)) if argv[0] == "squeue" else _array_acct(500, range(5))
        return subprocess.CompletedProcess(argv, 0, out, "")

    backend = SlurmBackend(runner=runner, jobs_dir=tmp_path, cluster="c")
    jobs = [Job(Handle("slurm", f"500_{i}", cluster="c"), backend) for i in range(100)]  # type: ignore[arg-type]
    infos = statuses(jobs)
    assert [c[0] for c in calls] == ["squeue", "sacct"]
    assert calls[0][calls[0].index("--jobs") + 1] == "500" and calls[1][calls[1].index("--jobs") + 1] == "500"
    states = [i.state.value for i in infos]  # type: ignore[union-attr]
    assert states[:5] == ["succeeded", "succeeded", "succeeded", "failed", "succeeded"]
    assert states[5:10] == ["running"] * 5 and states[10:] == ["pending"] * 90
    assert infos[3].detail == "exit 3"  # type: ignore[union-attr]


def test_logs_show_every_rank_by_default_each_line_with_its_rank(tmp_path: Path) -> None:
    logs, jobs = tmp_path / "logs", tmp_path / "jobs"
    (jobs / "r-71").mkdir(parents=True)
    logs.mkdir()
    meta = {"job_id": "71", "run": "r", "log_dir": str(logs), "launcher": "srun"}
    (jobs / "r-71" / "job.json").write_text(json.dumps(meta))
    for attempt, rank, text in [(0, 0, "a0 r0\n"), (0, 1, "a0 r1\n"), (1, 0, "a1 r0\n"), (1, 1, "a1 r1\n")]:
        (logs / f"r-71-attempt{attempt}-rank{rank}.out").write_text(text)
    backend = SlurmBackend(runner=lambda argv: subprocess.CompletedProcess(argv, 1, "", ""), jobs_dir=jobs, cluster="c")
    lines = [line for line in backend.logs("71") if "==>" not in line]
    assert lines == ["[rank 0] a0 r0", "[rank 0] a1 r0", "[rank 1] a0 r1", "[rank 1] a1 r1"]
    assert [line for line in backend.logs("71", rank=1) if "==>" not in line] == ["a0 r1", "a1 r1"]


def test_lock_knobs_that_do_not_fit_together_are_refused_at_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused here (exit 2), not after the job waited in the queue to be refused at its start."""
    monkeypatch.setenv("DIST_JOBS_LOCK_STALE_SECONDS", "30")  # the job inherits the submitter's environment
    runner = FakeRunner(sbatch=(0, fixture("sbatch_parsable.txt"), ""))
    slurm = backend(tmp_path, runner)
    with pytest.raises(UsageError, match="DIST_JOBS_LOCK_HEARTBEAT_SECONDS=20 is more than a third of") as caught:
        slurm.submit(load_spec(data={**SPEC, "env": {"DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "20"}}))
    assert caught.value.exit_code == 2 and "DIST_JOBS_LOCK_STALE_SECONDS=30" in str(caught.value)
    assert runner.calls == [] and not (tmp_path / "runs").exists()
