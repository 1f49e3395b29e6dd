"""The local backend as a queue: a detached `dist-jobs run`, attached to from other processes.

One job's life through the Python API and through the CLI: submit, wait, logs, status of a
failed rank, cancel, result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dist_jobs
from dist_jobs.api.job import Job
from support.paths import PYTHON, REPO, TESTS
from support.specs import tiny_train
from support.tiers import requires
from support.waiting import HUNG_S, eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENV = {"PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "OMP_NUM_THREADS": "1"}
TRAIN = tiny_train()


def dj(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **ENV}
    return subprocess.run(
        [PYTHON, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


@requires("torch")
def test_python_api_submit_attach_from_another_process_wait_logs_result(tmp_path: Path) -> None:
    spec = dist_jobs.load_spec(data={"name": "api-train", "nodes": 1, "procs_per_node": 2, "env": ENV, "train": TRAIN})
    job = dist_jobs.submit(spec, backend="local", workdir=tmp_path)
    assert isinstance(job, Job) and job.handle == f"local://{tmp_path.resolve()}/checkpoints/api-train"
    # Another process (another shell, a notebook) finds the job by its handle alone.
    probe = textwrap.dedent(f"""
        import json, dist_jobs
        job = dist_jobs.attach({job.handle!r})
        info = job.wait(timeout=240, poll=0.5)
        print(json.dumps({{"info": info.to_dict(), "result": job.result()}}))
    """)
    out = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, env={**os.environ, **ENV}, timeout=280)
    assert out.returncode == 0, out.stderr + "\n".join(job.logs())
    seen = json.loads(out.stdout)
    assert seen["info"]["state"] == "succeeded" and seen["info"]["word"] == "COMPLETED"
    assert seen["result"]["step"] == 4.0 and "train_loss" in seen["result"]  # 32 samples / (2 ranks x 4)
    rank1 = list(job.logs(rank=1))
    assert rank1 and not any(line.startswith("[rank") for line in rank1)  # one rank's lines as it wrote them
    assert [f"[rank 1] {line}" for line in rank1] == [line for line in job.logs() if line.startswith("[rank 1] ")]
    assert {line.split("]")[0] for line in job.logs()} == {"[rank 0", "[rank 1"}
    assert [i.handle for i in dist_jobs.list_jobs("local", workdir=tmp_path)] == [job.handle]


def test_cli_submit_wait_follow_exits_with_the_outcome_and_status_names_the_exit(tmp_path: Path) -> None:
    # Rank 1 fails only once rank 0 has printed: opening a FIFO blocks until both ends are open.
    fifo = tmp_path / "printed.fifo"
    os.mkfifo(fifo)
    code = (
        "import os; r = os.environ['RANK']; print('hello from', r, flush=True)\n"
        f"with open({str(fifo)!r}, 'w' if r == '0' else 'r') as f: pass\n"
        "raise SystemExit(3 if r == '1' else 0)"
    )
    proc = dj("submit", "--backend", "local", "--name", "fails", "--nodes", "2", "--procs-per-node", "1",
              "--wait", "--follow", "--", "python3", "-c", code, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    handle = proc.stdout.splitlines()[0]
    assert handle == f"local://{tmp_path.resolve()}/checkpoints/fails"
    assert "[rank 0] hello from 0" in proc.stdout and "[rank 1] hello from 1" in proc.stdout
    assert "failed (FAILED)  rank 1 failed first: exit 3" in proc.stderr
    assert "dist-jobs: exit code 3: the program failed: rank 1 exit 3; failed at once" in proc.stdout
    status = json.loads(dj("status", "-o", "json", handle, cwd=REPO).stdout)  # elsewhere: the handle is enough
    assert status["state"] == "failed"
    assert status["detail"] == "rank 1 failed first: exit 3; failed at once: the program's own error is not retried"
    assert status["ranks"] == {"1": "exit 3"}
    assert dj("wait", handle, cwd=REPO).returncode == 1
    assert dj("logs", "--rank", "1", handle, cwd=REPO).stdout == "hello from 1\n"
    bare = dj("status", "--backend", "local", "checkpoints/fails", cwd=tmp_path)
    assert bare.returncode == 0 and bare.stdout.startswith(handle)


def test_cancel_stops_every_rank_and_says_stopping_until_it_has_stopped(tmp_path: Path) -> None:
    # Each rank outlives the stop signal until the test releases it, as a rank checkpointing does.
    release = tmp_path / "release"
    code = textwrap.dedent(f"""
        import os, pathlib, signal, sys, time
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        print('pid', os.getpid(), flush=True)
        while not pathlib.Path({str(release)!r}).exists():
            time.sleep(0.05)
        sys.exit(1)
    """)
    sub = dj("submit", "--backend", "local", "--name", "long", "--nodes", "2", "--procs-per-node", "1",
             "-o", "json", "--", "python3", "-c", code, cwd=tmp_path)  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    handle = json.loads(sub.stdout)["handle"]
    job = dist_jobs.attach(handle)
    eventually(
        lambda: [line for line in job.logs() if " pid " in line],
        until=lambda said: len(said) >= 2,
        timeout=60,
        interval=0.2,
        what="both ranks' pid lines",
    )
    pids = [int(line.split()[-1]) for line in job.logs() if " pid " in line]
    assert len(pids) == 2 and job.status().state == "running"
    said = dj("cancel", handle, cwd=REPO).stdout
    assert said == f"stopping {handle} (cancelled; `dist-jobs wait {handle}` returns once it has stopped)\n"
    status = dj("status", handle, cwd=REPO).stdout
    assert f"{handle}  long  completing (COMPLETING)  stopping: cancelled, pid " in status, status
    release.touch()
    waited = dj("wait", "--timeout", "60", handle, cwd=REPO)
    assert waited.returncode == 3 and "cancelled (CANCELLED)" in waited.stdout, waited.stdout + waited.stderr
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or b"zombie" in Path(f"/proc/{pid}/status").read_bytes().lower()
    again = dj("cancel", handle, cwd=REPO)
    assert again.returncode == 1 and "not running" in again.stderr


def test_a_second_submit_of_a_running_run_is_refused(tmp_path: Path) -> None:
    argv = [
        "submit",
        "--backend",
        "local",
        "--name",
        "twice",
        "--procs-per-node",
        "1",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(30)",
    ]
    first = dj(*argv, cwd=tmp_path)
    second = dj(*argv, cwd=tmp_path)
    dj("cancel", first.stdout.strip(), cwd=tmp_path)
    assert second.returncode == 2 and "already running" in second.stderr and "hint:" in second.stderr


def test_status_by_handle_stays_light(tmp_path: Path) -> None:
    """`dist-jobs status HANDLE` loads no renderer, torch or kubernetes (yaml and the spec classes:
    issue 16's lazy imports)."""
    sub = dj("submit", "--backend", "local", "--name", "light", "--procs-per-node", "1", "--", "true", cwd=tmp_path)
    probe = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from dist_jobs.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main(["status", {sub.stdout.strip()!r}])
        print(json.dumps([rc, sorted({{m.split(".")[0] for m in sys.modules}})]))
    """)
    out = subprocess.run(
        [PYTHON, "-c", probe], capture_output=True, text=True, env={**os.environ, **ENV}, timeout=HUNG_S
    )
    rc, modules = json.loads(out.stdout)
    assert rc == 0 and not {"jinja2", "torch", "kubernetes", "submitit"} & set(modules), out.stderr


def _built_in(tmp_path: Path, name: str, **train: object) -> Path:
    """job.yaml of a built-in training run of 2 CPU ranks (JSON is YAML), the bar left at its default."""
    data = {"name": name, "nodes": 1, "procs_per_node": 2, "env": ENV, "train": tiny_train(progress=None, **train)}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(data))
    return path


@requires("torch")
def test_a_built_in_runs_logs_hold_its_log_lines_each_with_its_rank(tmp_path: Path) -> None:
    spec = _built_in(tmp_path, "logged")
    sub = dj("submit", "--backend", "local", "--wait", str(spec), cwd=tmp_path)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    handle = sub.stdout.splitlines()[0]
    rank0 = dj("logs", "--rank", "0", handle, cwd=REPO).stdout.splitlines()
    assert rank0[0].startswith("dist-jobs: rank 0/2 ") and rank0[0].endswith(")")
    assert "(local backend, " in rank0[0] and "(slurm," not in rank0[0]  # the local launcher, not SLURM
    assert [line for line in rank0 if " INFO step 4/4 " in line], rank0  # 32 samples / (2 ranks x 4)
    assert all(line.strip() and "\r" not in line and "step/s" not in line for line in rank0), rank0  # no bar
    every = dj("logs", handle, cwd=REPO).stdout.splitlines()
    assert every and all(line.startswith(("[rank 0] ", "[rank 1] ", "dist-jobs: ")) for line in every), every
    assert [line.removeprefix("[rank 0] ") for line in every if line.startswith("[rank 0] ")] == rank0


@requires("torch")
def test_a_rerun_of_a_finished_run_says_it_had_finished_and_trains_nothing(tmp_path: Path) -> None:
    spec = _built_in(tmp_path, "rerun")
    first = dj("run", "--backend", "local", str(spec), cwd=tmp_path)
    assert first.returncode == 0 and " INFO step 4/4 " in first.stdout, first.stdout + first.stderr
    again = dj("run", "--backend", "local", str(spec), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[rank 0] " in again.stdout and "the run had already finished (" in again.stdout, again.stdout
    assert "resumed from" not in again.stdout and " INFO step " not in again.stdout, again.stdout


def test_a_submit_while_another_submit_of_the_run_is_under_way_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Two submits of one run at once would both find no live launcher: the one that comes second
    finds the first's claim (a lock its process holds), is refused with exit 2 and leaves the
    run's record alone; the claim of a submitter that died is gone with it."""
    folder = tmp_path / "checkpoints" / "twice" / "local"
    folder.mkdir(parents=True)
    holds = "import fcntl, os, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX); "
    holds += "f.write(f'{os.getpid()}\\n'); f.flush(); print('held', flush=True); time.sleep(60)"
    submitter = subprocess.Popen([sys.executable, "-c", holds, str(folder / "submitting")], stdout=subprocess.PIPE)
    try:
        assert submitter.stdout is not None and submitter.stdout.readline() == b"held\n"
        argv = ["submit", "--backend", "local", "--name", "twice", "--procs-per-node", "1", "--", "true"]
        refused = dj(*argv, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert f"run twice is being submitted here by process {submitter.pid}" in refused.stderr
        assert sorted(p.name for p in folder.iterdir()) == ["submitting"]  # nothing written
    finally:
        submitter.kill()
        submitter.wait()
    taken = dj(*argv, cwd=tmp_path)  # the claim's submitter is gone
    assert taken.returncode == 0, taken.stderr
    assert (folder / "submitting").read_text() == ""  # released
    waited = dj("wait", "--timeout", "60", taken.stdout.strip(), cwd=tmp_path)
    assert waited.returncode == 0, waited.stdout + waited.stderr


def test_a_foreground_run_is_a_job_other_shells_can_ask_about(tmp_path: Path) -> None:
    """`dist-jobs run` records itself as `submit` does: while it runs, `status`, `logs` and `list`
    from another process find it by its handle, and it ends with its exit code recorded."""
    go = tmp_path / "go"
    # the program waits for the test's word (the file `go`), polling as a user's program would
    program = "import pathlib, time\nprint('waiting', flush=True)\n"
    program += f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)"
    argv = [PYTHON, "-m", "dist_jobs", "run", "--backend", "local", "--name", "fg", "--procs-per-node", "1"]
    run = subprocess.Popen(
        [*argv, "--", PYTHON, "-c", program], cwd=tmp_path, env={**os.environ, **ENV}, stdout=subprocess.PIPE, text=True
    )
    handle = f"local://{tmp_path.resolve()}/checkpoints/fg"
    try:
        logs = lambda: dj("logs", handle, cwd=tmp_path).stdout
        shown = lambda out: "[rank 0] waiting" in out
        eventually(logs, timeout=60, what="its output in `logs`", until=shown, give_up=run.poll)
        status = json.loads(dj("status", handle, "-o", "json", cwd=tmp_path).stdout)
        assert status["state"] == "running" and status["detail"] == f"pid {run.pid}", status
        assert handle in dj("list", "--backend", "local", cwd=tmp_path).stdout
    finally:
        go.touch()
        out, _ = run.communicate(timeout=HUNG_S)
    assert run.returncode == 0 and "[rank 0] waiting" in out  # on the terminal too
    ended = json.loads(dj("status", handle, "-o", "json", cwd=tmp_path).stdout)
    assert (ended["state"], ended["detail"]) == ("succeeded", "exit 0"), ended
