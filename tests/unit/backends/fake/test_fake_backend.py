"""A backend added in this folder alone (conftest registers it) works through the CLI, the API,
handles, logs and sweeps: nothing outside the registry lists backends."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest

import dist_jobs
from dist_jobs.api import attach
from dist_jobs.api.sweep_status import Sweep
from dist_jobs.backends import parse_handle
from dist_jobs.cli import main
from dist_jobs.errors import UsageError

from .backend import FakeBackend


@pytest.fixture
def spec_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text("name: fk\nprocs_per_node: 2\n")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_cli_offers_it_with_its_flag_and_handle_form(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["submit", "--help"])
    help_text = capsys.readouterr().out
    assert "fake: an in-memory queue" in help_text and "--fake-pool" in help_text
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    assert "fake://POOL/N" in capsys.readouterr().out


def test_render_submit_status_list_logs_cancel_through_the_cli(
    capsys: pytest.CaptureFixture[str], spec_file: Path
) -> None:
    code, rendered, _ = run(capsys, "render", "--backend", "fake", str(spec_file))
    assert code == 0 and json.loads(rendered)["name"] == "fk"

    code, out, _ = run(capsys, "submit", "--backend", "fake", "--fake-pool", "p", str(spec_file))
    assert code == 0 and out.strip() == "fake://p/1"
    assert (
        FakeBackend.queues["p"]["1"].payload
        == json.dumps(json.loads(FakeBackend.queues["p"]["1"].payload), sort_keys=True) + "\n"
    )

    code, out, _ = run(capsys, "status", "fake://p/1", "-o", "json")
    assert code == 0 and json.loads(out)["state"] == "running" and json.loads(out)["handle"] == "fake://p/1"

    code, out, _ = run(capsys, "list", "--backend", "fake", "--fake-pool", "p", "-o", "json")
    assert [row["handle"] for row in json.loads(out)] == ["fake://p/1"]

    code, out, _ = run(capsys, "logs", "fake://p/1")
    assert out.splitlines() == [
        "[rank 0] hello from rank 0",
        "[rank 0] fk done",
        "[rank 1] hello from rank 1",
        "[rank 1] fk done",
    ]
    code, out, _ = run(capsys, "logs", "fake://p/1", "--rank", "1")
    assert out.splitlines() == ["hello from rank 1", "fk done"]

    code, out, _ = run(capsys, "cancel", "fake://p/1")
    assert code == 0 and out.strip() == "cancelled fake://p/1"
    code, _, err = run(capsys, "cancel", "fake://p/1")  # the base's cancel asks exists() first
    assert code == 1 and "fake job 1 is not running: nothing to cancel" in err


def test_a_bare_id_takes_the_backend_and_its_flag(capsys: pytest.CaptureFixture[str], spec_file: Path) -> None:
    run(capsys, "submit", "--backend", "fake", "--fake-pool", "q", str(spec_file))
    FakeBackend.queues["q"]["1"].state = "COMPLETED"
    code, out, _ = run(capsys, "wait", "1", "--backend", "fake", "--fake-pool", "q", "-o", "json")
    assert code == 0 and json.loads(out)["state"] == "succeeded"


def test_a_bad_handle_of_it_is_a_usage_error_naming_its_form(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "status", "fake://p/x")
    assert code == 2 and "fake://POOL/N" in err and "Traceback" not in err
    with pytest.raises(UsageError):
        parse_handle("fake://p")
    assert str(parse_handle("fake://p/7")) == "fake://p/7"


def test_the_api_submits_attaches_and_reads_it(spec_file: Path) -> None:
    spec = dist_jobs.load_spec(spec_file)
    job = dist_jobs.submit(spec, "fake", pool="api")
    assert str(job) == "fake://api/1"
    again = attach(str(job))
    assert again.status().state.value == "running"
    assert list(again.logs(rank=0)) == ["hello from rank 0", "fk done"]
    FakeBackend.queues["api"]["1"].state = "FAILED"
    assert again.wait(timeout=5).state.value == "failed"


def test_a_sweep_runs_one_job_per_trial_by_default(capsys: pytest.CaptureFixture[str], spec_file: Path) -> None:
    code, out, _ = run(
        capsys,
        "sweep",
        "--backend",
        "fake",
        "--fake-pool",
        "s",
        str(spec_file),
        "--grid",
        "train.lr=0.1,0.2",
        "-o",
        "json",
    )
    assert code == 0
    handles = [t["handle"] for t in json.loads(out)["trials"]]
    assert handles == ["fake://s/1", "fake://s/2"]
    assert [j.spec.train.lr for j in FakeBackend.queues["s"].values()] == [0.1, 0.2]

    code, out, _ = run(capsys, "sweep", "status", "fk", "-o", "json")
    assert code == 0 and [r["state"] for r in json.loads(out)] == ["running", "running"]
    code, out, _ = run(capsys, "sweep", "cancel", "fk")
    assert code == 0 and out.splitlines() == ["cancelled fake://s/1", "cancelled fake://s/2"]
    assert [r.state for r in Sweep.load("fk").status()] == ["cancelled", "cancelled"]


KNOBS = {"DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "20"}  # more than a third of the stale limit below


class PodLike(FakeBackend):
    """Its jobs start with spec.env alone, as a pod does."""

    inherits_environment = False


def test_its_submit_refuses_lock_knobs_that_do_not_fit_together(
    spec_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is the base class's submit: a backend gets it without a line of its own."""
    monkeypatch.setenv("DIST_JOBS_LOCK_STALE_SECONDS", "30")  # its jobs inherit this environment
    spec = dist_jobs.load_spec(spec_file, overrides={f"env.{k}": v for k, v in KNOBS.items()})
    with pytest.raises(UsageError, match="DIST_JOBS_LOCK_HEARTBEAT_SECONDS=20 is more than a third of") as caught:
        FakeBackend(pool="knobs").submit(spec)
    assert caught.value.exit_code == 2 and "DIST_JOBS_LOCK_STALE_SECONDS=30" in str(caught.value)
    assert FakeBackend.queues["knobs"] == {}  # nothing handed to the scheduler
    assert str(PodLike(pool="pods").submit(spec)) == "fake://pods/1"  # the submitter's 30 s is not its jobs'


def test_a_sweep_checks_every_trials_environment_before_any_is_submitted(
    capsys: pytest.CaptureFixture[str], spec_file: Path
) -> None:
    """Trial 1's knobs do not fit together: no trial is submitted, though trial 0's do."""
    argv = [
        "sweep",
        "--backend",
        "fake",
        "--fake-pool",
        "k",
        str(spec_file),
        "--env",
        "DIST_JOBS_LOCK_STALE_SECONDS=30",
    ]
    code, _, err = run(capsys, *argv, "--grid", "env.DIST_JOBS_LOCK_HEARTBEAT_SECONDS=10,20")
    assert code == 2 and "DIST_JOBS_LOCK_HEARTBEAT_SECONDS=20 is more than a third of" in err
    assert FakeBackend.queues.get("k", {}) == {}


def test_a_package_declares_it_in_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import dist_jobs.backends as registry

    registry.unregister_backend("fake")
    assert "fake" not in registry.backend_names()
    point = metadata.EntryPoint("fake", f"{FakeBackend.__module__}:FakeBackend", registry.ENTRY_POINTS)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [point] if group == registry.ENTRY_POINTS else [])
    monkeypatch.setattr(registry, "_plugins_read", False)  # as in a fresh process, where they are read once
    assert registry.backend_class("fake") is FakeBackend  # a name not registered: the group is read
    assert registry.backend_names()[-1] == "fake" and str(parse_handle("fake://p/1")) == "fake://p/1"


def test_the_cli_takes_a_backend_of_the_entry_point_group_by_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], spec_file: Path
) -> None:
    import dist_jobs.backends as registry

    registry.unregister_backend("fake")
    point = metadata.EntryPoint("fake", f"{FakeBackend.__module__}:FakeBackend", registry.ENTRY_POINTS)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [point] if group == registry.ENTRY_POINTS else [])
    monkeypatch.setattr(registry, "_plugins_read", False)
    code, out, _ = run(capsys, "submit", "--backend", "fake", str(spec_file))
    assert code == 0 and out.strip() == "fake://main/1"
