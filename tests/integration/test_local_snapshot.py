"""Code snapshots on the local backend, the user's way (the CLI and dist_jobs.sweep): a job
submitted with --snapshot runs the code as it was at submit although the script is edited before
the job reaches it; status names the commit and the uncommitted changes; without --snapshot the
job runs the script as it is when it gets there. A local sweep runs every trial, those its driver
starts later included, from one snapshot taken when the sweep was submitted. The dry run of a
snapshot is what submit runs: the copy's folder it names is where the ranks start."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import dist_jobs
from dist_jobs.backends.local.jobs import LocalBackend
from dist_jobs.backends.local.runner import LocalRunner
from support.git_project import git
from support.paths import PYTHON, REPO, TESTS
from support.waiting import HUNG_S, eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ENV = {"PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "OMP_NUM_THREADS": "1"}
# The job waits at its gate (a FIFO outside the code) before it runs train.py: the test edits the
# script while the job is held there, then lets it through.
HELD = 'read line < "$GATE" && exec python3 train.py'


def environ(proj: Path) -> dict[str, str]:
    """This shell's environment, with the project's lib/ on PYTHONPATH (as a user's venv would)."""
    return {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([ENV["PYTHONPATH"], str(proj / "lib")])}


def dj(*args: str, cwd: Path, proj: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = environ(proj) if proj else {**os.environ, **ENV}
    return subprocess.run(
        [PYTHON, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=HUNG_S
    )


def project(tmp_path: Path) -> Path:
    """A git repo whose train.py, as submitted, has an uncommitted change; it imports lib/version.py
    from PYTHONPATH."""
    proj = tmp_path / "proj"
    (proj / "lib").mkdir(parents=True)
    (proj / "lib" / "version.py").write_text("V = 'lib as submitted'\n")
    (proj / "train.py").write_text("print('committed version')\n")
    (proj / ".gitignore").write_text("checkpoints/\n")
    git(proj, "init", "-q")
    git(proj, "add", "-A")
    git(proj, "commit", "-qm", "first")
    (proj / "train.py").write_text("import version\nprint('submitted version', version.V)\n")
    return proj


def edit(proj: Path) -> None:
    (proj / "train.py").write_text("print('edited after submit')\n")
    (proj / "lib" / "version.py").write_text("V = 'lib edited'\n")


def gate(path: Path) -> Path:
    os.mkfifo(path)
    return path


def release(fifo: Path, timeout: float = 120.0) -> None:
    """Let the job held at `fifo` through, once it waits there (a FIFO opens for writing only
    while a reader has it open: polled with a deadline, never a fixed sleep)."""

    def open_for_writing() -> int | None:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            assert exc.errno == errno.ENXIO, exc  # no reader yet
            return None

    fd = eventually(
        open_for_writing, until=lambda fd: fd is not None, timeout=timeout, interval=0.05, what=f"a job at {fifo}"
    )
    assert fd is not None
    os.write(fd, b"go\n")
    os.close(fd)


def submit_held(proj: Path, fifo: Path, name: str, *flags: str) -> str:
    proc = dj("submit", "--backend", "local", "--name", name, "--procs-per-node", "1", "--env", f"GATE={fifo}",
              *flags, "--", "sh", "-c", HELD, cwd=proj, proj=proj)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()[0]


def test_submit_with_snapshot_runs_the_code_as_submitted_and_without_it_as_found(tmp_path: Path) -> None:
    proj = project(tmp_path)
    head = git(proj, "rev-parse", "HEAD").strip()
    handle = submit_held(proj, gate(tmp_path / "gate"), "snap", "--snapshot")
    plain = submit_held(proj, gate(tmp_path / "gate-plain"), "plain")
    edit(proj)  # while both jobs wait at their gates
    release(tmp_path / "gate")
    release(tmp_path / "gate-plain")
    assert dj("wait", handle, cwd=proj).returncode == 0 and dj("wait", plain, cwd=proj).returncode == 0
    logs = dj("logs", handle, cwd=proj).stdout
    assert "[rank 0] submitted version lib as submitted" in logs and "edited" not in logs  # lib/ too
    status = json.loads(dj("status", "-o", "json", handle, cwd=tmp_path).stdout)
    copy = proj / "checkpoints" / "snap" / "local" / "snapshots"
    code = status["extra"]["code"]
    assert code.startswith(f"snapshot of {head[:12]} (with uncommitted changes) in {copy.resolve()}/snap-"), code
    assert f"code: snapshot of {head[:12]}" in dj("status", handle, cwd=tmp_path).stdout
    # The job's record runs the same copy again: its spec names it as the working directory.
    recorded = proj / "checkpoints" / "snap" / "local" / "spec.yaml"
    assert f"workdir: {code.rsplit(' in ', 1)[1]}" in recorded.read_text()
    again = subprocess.Popen([PYTHON, "-m", "dist_jobs", "run", "--backend", "local", str(recorded)],
                             cwd=proj, env=environ(proj), stdout=subprocess.PIPE, text=True)  # fmt: skip
    release(tmp_path / "gate")
    assert again.communicate(timeout=HUNG_S)[0].count("submitted version lib as submitted") == 1
    assert again.returncode == 0
    # Without --snapshot nothing changes: the job runs the script as it is when it gets there.
    assert "[rank 0] edited after submit" in dj("logs", plain, cwd=proj).stdout
    assert "code" not in json.loads(dj("status", "-o", "json", plain, cwd=tmp_path).stdout)["extra"]
    assert not (proj / "checkpoints" / "plain" / "local" / "snapshots").exists()


def test_the_dry_run_of_a_snapshot_is_the_spec_submit_runs_and_its_copy_is_where_the_ranks_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = project(tmp_path)
    monkeypatch.setenv("PYTHONPATH", environ(proj)["PYTHONPATH"])  # the launcher imports dist_jobs
    noon = time.mktime((2026, 11, 28, 12, 0, 0, 0, 0, -1))  # the clock the copy's folder is named for
    local = LocalBackend(workdir=proj, clock=lambda: noon)
    show = "import os; print('cwd', os.getcwd()); exec(open('train.py').read())"
    data = {"name": "dry", "procs_per_node": 1, "snapshot": True, "command": ["python3", "-c", show]}
    spec = dist_jobs.load_spec(data={**data, "env": {"OMP_NUM_THREADS": "1"}})
    dry = local.prepare(spec)  # what `submit --dry-run` prints
    assert dry.snapshot is not None
    copy = dry.snapshot.dest
    assert copy == proj.resolve() / "checkpoints" / "dry" / "local" / "snapshots" / f"dry-20261128-120000-{os.getpid()}"
    assert not copy.parent.exists()  # the dry run copies nothing
    run_dir = local.submit(spec).job_id
    ended = eventually(lambda: local.status(run_dir), until=lambda s: s.finished, timeout=120, what="the job's end")
    assert ended.state == "COMPLETED", ended
    recorded = dist_jobs.load_spec(data=yaml.safe_load((Path(run_dir) / "local" / "spec.yaml").read_text()))
    assert recorded == dry.spec and recorded.workdir == str(copy)  # the launcher runs the dry run's spec
    assert LocalRunner(workdir=proj).prepare(recorded).payload == dry.payload  # and plans the same processes
    assert sorted(p.name for p in copy.parent.iterdir()) == [copy.name]  # the copy, exactly there
    logs = "\n".join(local.logs(run_dir))
    assert f"[rank 0] cwd {copy}\n" in logs + "\n" and "submitted version lib as submitted" in logs


def test_run_with_snapshot_starts_the_ranks_in_a_copy_of_the_code(tmp_path: Path) -> None:
    proj = project(tmp_path)
    show = "import os; print('cwd', os.getcwd()); exec(open('train.py').read())"
    proc = dj("run", "--backend", "local", "--name", "fg", "--procs-per-node", "1", "--snapshot",
              "--", "python3", "-c", show, cwd=proj, proj=proj)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    copies = proj.resolve() / "checkpoints" / "fg" / "local" / "snapshots"
    assert f"cwd {copies}/fg-" in proc.stdout and "submitted version" in proc.stdout


def test_a_local_sweep_runs_every_trial_from_the_snapshot_taken_at_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proj = project(tmp_path)
    gates = [gate(tmp_path / "gate0"), gate(tmp_path / "gate1")]
    monkeypatch.chdir(proj)
    monkeypatch.setenv("PYTHONPATH", environ(proj)["PYTHONPATH"])  # the driver and its trials import dist_jobs
    spec = {"name": "sw", "procs_per_node": 1, "command": ["sh", "-c", HELD], "env": {"OMP_NUM_THREADS": "1"}}
    # One trial at a time: the driver starts trial 1 only after trial 0 ended, long after the edit.
    sweep = dist_jobs.sweep(spec, grid={"env.GATE": [str(g) for g in gates]}, max_parallel=1, backend="local")
    edit(proj)
    for fifo in gates:
        release(fifo)
    for job in sweep.jobs:
        assert job.wait(timeout=HUNG_S, poll=0.2).word == "COMPLETED"
        assert "[rank 0] submitted version lib as submitted" in "\n".join(job.logs())
    codes = {job.status().extra["code"] for job in sweep.jobs}
    assert len(codes) == 1 and f"in {proj.resolve()}/checkpoints/sw/snapshots/sw-" in codes.pop()


def test_too_much_code_is_refused_and_the_last_job_of_the_run_keeps_its_record(tmp_path: Path) -> None:
    proj = project(tmp_path)
    first = dj("submit", "--backend", "local", "--name", "big", "--procs-per-node", "1", "--wait", "--", "true",
               cwd=proj, proj=proj)  # fmt: skip
    assert first.returncode == 0, first.stderr
    with (proj / "weights.bin").open("wb") as fh:  # sparse: its size counts, no disk is used
        fh.truncate(300 * 2**20)
    refused = dj("submit", "--backend", "local", "--name", "big", "--procs-per-node", "1", "--snapshot", "--", "true",
                 cwd=proj, proj=proj)  # fmt: skip
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "more than the 256 MiB limit (biggest: weights.bin (300 MiB)" in refused.stderr
    assert "add them to .gitignore" in refused.stderr
    status = json.loads(dj("status", "-o", "json", first.stdout.splitlines()[0], cwd=tmp_path).stdout)
    assert status["word"] == "COMPLETED"  # the refused submit removed nothing of the job before it
