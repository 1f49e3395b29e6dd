"""`dist-jobs run --backend local`: cluster-shaped environments, real processes, clean teardown."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from dist_jobs.backends.local.runner import plan
from dist_jobs.ranks import resolve
from dist_jobs.spec.load import load_spec
from support.paths import PYTHON
from support.tiers import requires
from support.waiting import HUNG_S, eventually

ALLREDUCE = textwrap.dedent("""
    import json, os, socket, datetime
    import torch, torch.distributed as dist
    from dist_jobs.ranks import resolve
    from dist_jobs.ranks.selfcheck import check
    info = resolve()
    check(info)
    info.export()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(info.rank)])
    dist.all_reduce(t)
    print(json.dumps({"rank": info.rank, "local_rank": info.local_rank, "node_rank": info.node_rank,
                      "world": dist.get_world_size(), "sum": t.item(), "source": info.source}), flush=True)
    dist.destroy_process_group()
""")


def test_plan_seed_arithmetic(tmp_path) -> None:
    spec = load_spec(data={"name": "seed", "nodes": 2, "gpus_per_node": 4})
    procs = plan(spec, tmp_path, 12345, "77", use_gpus=False)
    infos = [resolve(p.env) for p in procs]
    assert [i.rank for i in infos] == list(range(8)) and {i.world_size for i in infos} == {8}
    node1 = [i for i in infos if i.node_rank == 1]
    assert [i.rank for i in node1] == [4, 5, 6, 7] and [i.local_rank for i in node1] == [0, 1, 2, 3]
    assert {i.master_addr for i in infos} == {"127.0.0.1"} and {i.source for i in infos} == {"slurm"}
    assert all(p.env["CUDA_VISIBLE_DEVICES"] == "" for p in procs)


def test_plan_expands_home_in_checkpoint_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`~/ckpts` is the user's home, as the trainer and the SLURM backend read it, not a folder
    named `~` below the working directory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    spec = load_spec(data={"name": "home", "procs_per_node": 2, "checkpoint_dir": "~/ckpts"})
    procs = plan(spec, tmp_path / "work", 12345, "77", use_gpus=False)
    assert {p.env["DIST_JOBS_CHECKPOINT_DIR"] for p in procs} == {str(tmp_path / "home" / "ckpts")}


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "dist_jobs", "run", "--backend", "local", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _records(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("[") and "{" in line:  # "[rank 3] {...}" or "[node 1] [default0]:{...}"
            out.append(json.loads(line[line.index("{") :]))
    return out


@requires("torch")
def test_real_allreduce_srun_mode(tmp_path) -> None:
    (tmp_path / "ar.py").write_text(ALLREDUCE)
    proc = _run(["--nodes", "2", "--procs-per-node", "2", "--", PYTHON, "ar.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = sorted(_records(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1, 2, 3]
    assert all(r["sum"] == 6.0 and r["world"] == 4 and r["source"] == "slurm" for r in recs)
    assert [(r["node_rank"], r["local_rank"]) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "[rank 3] {" in proc.stdout  # every line carries its rank


@requires("torch")
def test_real_allreduce_torchrun_mode(tmp_path) -> None:
    (tmp_path / "ar.py").write_text(ALLREDUCE)
    proc = _run(
        ["--nodes", "2", "--procs-per-node", "2", "--launcher", "torchrun", "--", "python3", "ar.py"],
        tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = _records(proc.stdout)
    assert sorted(r["rank"] for r in recs) == [0, 1, 2, 3]
    assert all(r["sum"] == 6.0 and r["source"] == "torchrun" for r in recs)


@requires("torch")
def test_torchrun_mode_keeps_the_interpreter_and_its_flags(tmp_path) -> None:
    """`-- python3 -u -c CODE` under torchrun runs exactly that (torchrun once got `-u -c CODE`)."""
    code = "import os, sys; print('flags', sys.stdout.write_through, sys.flags.optimize, os.environ['RANK'])"
    proc = _run(["--procs-per-node", "1", "--launcher", "torchrun", "--", "python3", "-u", "-O", "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "flags True 1 0" in proc.stdout


@requires("torch")
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_args_with_dollars_reach_the_program_intact(tmp_path: Path, launcher: str) -> None:
    """torchrun runs every worker arg through string.Template (its `${local_rank}` macro), which
    turned `$$x` into `$x` and `${local_rank}` into 0: every launch mode hands the words over as written."""
    words = ["$$x", "${local_rank}", "$local_rank", "a$b", "$"]
    code = "import json, sys; print('ARGS ' + json.dumps(sys.argv[1:]))"
    proc = _run(["--procs-per-node", "1", "--launcher", launcher, "--", "python3", "-c", code, *words], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if "ARGS " in line]
    assert json.loads(line.split("ARGS ", 1)[1]) == words


@requires("torch")
def test_a_checkpoint_dir_that_is_a_file_is_bad_input(tmp_path) -> None:
    (tmp_path / "ckfile").write_text("")
    proc = _run(["--procs-per-node", "1", "--checkpoint-dir", "ckfile", "--", PYTHON, "-c", "pass"], tmp_path)
    assert proc.returncode == 2 and "checkpoint_dir" in proc.stderr and "Traceback" not in proc.stderr
    env = {**os.environ, "DIST_JOBS_ENV": "single"}
    argv = [PYTHON, "-m", "dist_jobs.train", "--checkpoint-dir", "ckfile", "--max-steps", "1", "--fake-samples", "64"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "not a folder" in proc.stderr and "Traceback" not in proc.stderr


def test_gpu_request_falls_back_to_cpu_with_notice(tmp_path) -> None:
    proc = _run(
        [
            "--nodes",
            "1",
            "--gpus",
            "2",
            "--",
            PYTHON,
            "-c",
            "import os; print('cvd=' + repr(os.environ['CUDA_VISIBLE_DEVICES']))",
        ],
        tmp_path,
    )
    assert proc.returncode == 0
    if "this machine has 0" in proc.stdout:
        assert proc.stdout.count("cvd=''") == 2


def test_first_failure_tears_down_and_returns_its_code(tmp_path) -> None:
    code = "import os, sys, time; r = int(os.environ['SLURM_PROCID']); time.sleep(0.3 if r == 2 else 600); sys.exit(7)"
    start = time.monotonic()
    proc = _run(["--nodes", "2", "--procs-per-node", "2", "--", PYTHON, "-c", code], tmp_path)
    assert proc.returncode == 7
    assert time.monotonic() - start < 30  # the sleepers were torn down, not waited for
    # the program's own error: failed once, never restarted
    assert "the program failed: rank 2 exit 7" in proc.stdout and "restarting" not in proc.stdout, proc.stdout


def test_a_rank_killed_by_a_signal_restarts_every_rank_in_place(tmp_path: Path) -> None:
    """Rank 2 SIGKILLed (the OOM killer, `kill -9`) on the first start: the verdict is "rank
    killed", every rank starts again under the same lock, and the run succeeds; both verdicts
    are recorded in the run directory."""
    code = textwrap.dedent("""
        import os, pathlib, signal, time
        mark = pathlib.Path("killed-once")
        if os.environ["RANK"] == "2" and not mark.exists():
            mark.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2 if mark.exists() else 600)
    """)
    proc = _run(["--name", "killed", "--nodes", "2", "--procs-per-node", "2", "--", PYTHON, "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank killed: rank 2 killed by SIGKILL (exit 137); restarted in place" in proc.stdout, proc.stdout
    assert "restarting in place: restart 1 of at most 3" in proc.stdout
    (record,) = (tmp_path / "checkpoints" / "killed" / "verdicts").iterdir()
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(v["ending"], v["action"], v["attempt"]) for v in lines] == [
        ("rank killed", "restart", "0"),
        ("completed", "done", "0.1"),
    ]


def test_a_command_that_fails_at_start_is_not_told_as_a_preemption(tmp_path: Path) -> None:
    proc = _run(["--nodes", "1", "--procs-per-node", "2", "--", PYTHON, "nosuch.py"], tmp_path)
    assert proc.returncode == 2 and "can't open file" in proc.stdout, proc.stdout + proc.stderr
    # whichever rank found the file missing first
    assert re.search(r"dist-jobs: exit code 2: the program failed: rank \d exit 2; failed at once", proc.stdout)
    assert not any(word in proc.stdout for word in ("checkpoint", "preempt", "step boundary")), proc.stdout
    # One rank fails while the other runs: the other is stopped, in those words.
    code = "import os, sys, time; r = os.environ['SLURM_PROCID']; time.sleep(600 if r == '1' else 0); sys.exit(3)"
    proc = _run(["--nodes", "1", "--procs-per-node", "2", "--", PYTHON, "-c", code], tmp_path)
    assert (
        proc.returncode == 3
        and "rank 0 failed (exit 3): sending SIGUSR1 to every process (stopping the others)" in proc.stdout
    )
    assert "checkpoint" not in proc.stdout, proc.stdout


def test_ctrl_c_stops_everything(tmp_path) -> None:
    marker = f"djtest-{uuid.uuid4().hex}"
    code = f"import time; print('up', flush=True); time.sleep(600)  # {marker}"
    proc = subprocess.Popen(
        [PYTHON, "-m", "dist_jobs", "run", "--nodes", "2", "--procs-per-node", "2", "--", PYTHON, "-c", code],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    _wait_up(proc, 4)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=HUNG_S) == 130
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes left running: {left}"


def test_dry_run_plan_names_every_process(tmp_path) -> None:
    from dist_jobs.backends.local.runner import LocalRunner

    spec = load_spec(data={"name": "x", "nodes": 2, "procs_per_node": 2})
    payload = LocalRunner(workdir=tmp_path).prepare(spec).payload
    assert payload.count("# rank ") == 4 and "SLURM_PROCID=3" in payload


# -- signals, orphans and the run directory lock ----------------------------------------------------

# A rank that checkpoints the way the training does: the preemption signal sets a flag, the rank
# finishes its "step", says so and exits with the requeue code.
PREEMPTIBLE = textwrap.dedent("""
    import os, signal, sys, time
    got = []
    signal.signal(signal.SIGUSR1, lambda n, f: got.append(n))
    print("up", os.environ["SLURM_PROCID"], flush=True)
    while not got:
        time.sleep(0.05)
    print("checkpointed after", signal.Signals(got[0]).name, flush=True)
    sys.exit(200)
""")


def _start(args: list[str], cwd: Path, marker: str, script: str = PREEMPTIBLE) -> subprocess.Popen[str]:
    # The marker in the file name puts it on every rank's command line, where pgrep finds it.
    (cwd / f"rank-{marker}.py").write_text(script)
    return subprocess.Popen(
        [PYTHON, "-m", "dist_jobs", "run", "--backend", "local", *args, "--", PYTHON, f"rank-{marker}.py"],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_up(proc: subprocess.Popen[str], count: int) -> list[str]:
    lines: list[str] = []
    assert proc.stdout is not None
    # Counted in the whole text: torchrun's --tee can put two ranks' words on one line.
    while len(re.findall(r"[\]:] ?up\b", "".join(lines))) < count:
        line = proc.stdout.readline()
        assert line, "launcher ended early:\n" + "".join(lines)
        lines.append(line)
    return lines


def _read_until(proc: subprocess.Popen[str], text: str) -> list[str]:
    lines: list[str] = []
    assert proc.stdout is not None
    while not lines or text not in lines[-1]:
        line = proc.stdout.readline()
        assert line, f"launcher ended before saying {text!r}:\n" + "".join(lines)
        lines.append(line)
    return lines


def _left(marker: str) -> list[str]:
    """pids whose command line holds `marker`."""
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def _all_gone(marker: str, within: float) -> None:
    """Wait up to `within` s for every process whose command line holds `marker` to go."""
    eventually(
        lambda: _left(marker),
        until=lambda left: left == [],
        timeout=within,
        interval=0.1,
        what="every process of the run to go (pids still running)",
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_term_hup_and_int_reach_every_rank_as_the_preemption_signal(tmp_path: Path, sig: signal.Signals) -> None:
    """What a scheduler, `timeout`, systemd, a closed terminal or Ctrl-C sends to the launcher
    becomes the job's preemption signal (USR1) for every rank; all checkpoint and exit 200, and
    so does the launcher, last."""
    marker = f"djtest-{uuid.uuid4().hex}"
    proc = _start(["--nodes", "2", "--procs-per-node", "2"], tmp_path, marker)
    lines = _wait_up(proc, 4)
    assert len(_left(marker)) >= 4
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=HUNG_S)
    text = "".join(lines) + out
    assert proc.returncode == 200, text
    assert f"dist-jobs: got {sig.name}: sending SIGUSR1 to every process" in text
    assert text.count("checkpointed after SIGUSR1") == 4, text
    assert "dist-jobs: exit code 200: preempted: every rank checkpointed; to resume from the latest checkpoint" in text
    assert _left(marker) == []
    assert not (tmp_path / "checkpoints" / "dist-job" / "LOCK").exists()  # released


def test_ranks_without_checkpointing_end_in_128_plus_the_signal(tmp_path: Path) -> None:
    marker = f"djtest-{uuid.uuid4().hex}"
    sleeper = "import time; print('up', flush=True); time.sleep(600)"
    proc = _start(["--nodes", "1", "--procs-per-node", "2"], tmp_path, marker, sleeper)
    _wait_up(proc, 2)
    assert len(_left(marker)) >= 2
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=HUNG_S)
    assert proc.returncode == 143, out
    assert "exit code 143: cancelled: stopped by SIGTERM before every rank checkpointed" in out
    assert _left(marker) == []


def test_a_second_signal_kills_at_once(tmp_path: Path) -> None:
    """A rank that ignores the preemption signal would be waited for during the grace period
    (120 s here); a second SIGTERM ends it now."""
    marker = f"djtest-{uuid.uuid4().hex}"
    stubborn = "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); print('up', flush=True)\n"
    stubborn += "time.sleep(600)"
    proc = _start(["--nodes", "1", "--procs-per-node", "2"], tmp_path, marker, stubborn)
    _wait_up(proc, 2)
    assert len(_left(marker)) >= 2
    proc.send_signal(signal.SIGTERM)
    _read_until(proc, "to every process")  # the launcher took the first signal and forwarded it
    assert proc.poll() is None  # still in its grace period
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=HUNG_S)
    assert time.monotonic() - started < 15
    assert proc.returncode == 143 and "got SIGTERM again: killing every process now" in out, out
    assert _left(marker) == []


@requires("torch")
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_sigkill_of_the_launcher_leaves_no_process_and_the_next_run_takes_over(tmp_path: Path, launcher: str) -> None:
    """The launcher SIGKILLed mid-run: every rank (torchrun's workers too, which torchrun puts in
    sessions of their own) is gone within seconds, and the next run in the same run directory
    takes the dead launcher's lock over at once."""
    marker = f"djtest-{uuid.uuid4().hex}"
    proc = _start(["--nodes", "2", "--procs-per-node", "2", "--launcher", launcher], tmp_path, marker)
    _wait_up(proc, 4)
    assert len(_left(marker)) >= 4
    killed = time.monotonic()
    proc.kill()
    proc.wait()
    _all_gone(marker, within=5.0)
    print(f"{launcher}: every rank gone {time.monotonic() - killed:.2f} s after the SIGKILL")
    again = _run(["--nodes", "1", "--procs-per-node", "1", "--", PYTHON, "-c", "print('second run')"], tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"dist-jobs: took over the lock of {tmp_path / 'checkpoints' / 'dist-job'}: its holder (local run, pid " in (
        again.stdout
    )
    assert "is not running any more" in again.stdout and "[rank 0] second run" in again.stdout


def test_what_a_rank_leaves_behind_does_not_outlive_the_run(tmp_path: Path) -> None:
    marker = f"djtest-{uuid.uuid4().hex}"
    # A daemon in a session of its own, detached from the rank: the keeper (a subreaper) inherits it.
    daemon = textwrap.dedent(f"""
        import os, subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)  # {marker}"], start_new_session=True)
        print("up", flush=True)
    """)
    proc = _start(["--nodes", "1", "--procs-per-node", "2"], tmp_path, marker, daemon)
    out, _ = proc.communicate(timeout=HUNG_S)
    assert proc.returncode == 0, out
    _all_gone(marker, within=5.0)


def _wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of `pid`: how often it went to sleep."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        total += int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status.read_text(), re.M)[1])  # type: ignore[index]
    return total


def test_the_launcher_and_keepers_sleep_while_the_ranks_work(tmp_path: Path) -> None:
    """Beside ranks that use every core, a supervisor that polls takes CPU from them many times a
    second; the launcher and each keeper wake only when something happens."""
    marker = f"djtest-{uuid.uuid4().hex}"
    # each rank sleeps well past the window, however far apart the two start
    quiet = 'import os, time; print("up", os.environ["RANK"], flush=True); time.sleep(8)'
    proc = _start(["--nodes", "1", "--procs-per-node", "2"], tmp_path, marker, quiet)
    _wait_up(proc, 2)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
    keepers = [int(pid) for pid in children.split()]
    assert len(keepers) == 2
    before = {pid: _wakeups(pid) for pid in [proc.pid, *keepers]}
    time.sleep(2.0)
    woke = {pid: _wakeups(pid) - count for pid, count in before.items()}
    out, _ = proc.communicate(timeout=HUNG_S)
    assert proc.returncode == 0, out
    # A 50 ms poll would show about 40 here, a 100 ms one 20; the lock's heartbeat beats far less often.
    assert all(count <= 3 for count in woke.values()), f"wake-ups in 2 s, by pid: {woke}"


def test_a_second_run_in_the_same_run_directory_is_refused(tmp_path: Path) -> None:
    marker = f"djtest-{uuid.uuid4().hex}"
    first = _start(["--nodes", "1", "--procs-per-node", "2"], tmp_path, marker)
    try:
        _wait_up(first, 2)
        second = _run(["--nodes", "1", "--procs-per-node", "1", "--", PYTHON, "-c", "print('second run')"], tmp_path)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "second run" not in second.stdout  # no rank of it started
        handle = f"local://{(tmp_path / 'checkpoints' / 'dist-job').resolve()}"
        assert second.stderr.startswith(
            f"dist-jobs run: run dist-job is already running here ({handle}, launcher pid {first.pid})"
        ), second.stderr  # the foreground run is a job with a handle, as a submitted one
        assert f"cancel it (dist-jobs cancel {handle}), or pick another --name" in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        other = ["--name", "other", "--procs-per-node", "1", "--", PYTHON, "-c", "print('other')"]
        assert _run(other, tmp_path).returncode == 0  # another run directory: no conflict
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=HUNG_S)
    assert first.returncode == 200
    third = _run(["--procs-per-node", "1", "--", PYTHON, "-c", "print('third run')"], tmp_path)
    assert third.returncode == 0 and "took over" not in third.stdout, third.stdout + third.stderr


def test_a_launcher_that_lost_its_lock_ends_its_run(tmp_path: Path) -> None:
    """Another run took the lock over (this launcher looked dead to it, say after a long stop):
    the launcher ends its own run at once, without a checkpoint, rather than share the directory."""
    marker = f"djtest-{uuid.uuid4().hex}"
    (tmp_path / f"rank-{marker}.py").write_text(PREEMPTIBLE)
    proc = subprocess.Popen(
        [PYTHON, "-m", "dist_jobs", "run", "--procs-per-node", "2", "--", PYTHON, f"rank-{marker}.py"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "0.2"},
    )
    _wait_up(proc, 2)
    lock = tmp_path / "checkpoints" / "dist-job" / "LOCK"
    record = json.loads(lock.read_text())
    lock.write_text(json.dumps({**record, "token": "someone-else", "pid": 1}))
    out, _ = proc.communicate(timeout=HUNG_S)
    assert proc.returncode == 6, out  # as on every backend: LOCK_LOST_EXIT_CODE
    assert f"dist-jobs: lost the lock of {lock.parent} (it is now held by local run, pid 1 on host " in out
    assert "checkpointed after" not in out and _left(marker) == []
    assert json.loads(lock.read_text())["token"] == "someone-else"  # the new holder's lock stays


@pytest.mark.parametrize(
    ("codes", "want"),
    [((0, 0), 0), ((200, 200), 200), ((200, 3), 3), ((0, 7), 7), ((0, -9), 200)],  # killed: run it again
    ids=["done", "preempted", "failed-beside-a-checkpoint", "failed", "killed"],
)
def test_the_launchers_exit_code_says_what_happened(tmp_path: Path, codes: tuple[int, int], want: int) -> None:
    from dist_jobs.backends.local.procs import ProcessGroup

    def program(code: int) -> list[str]:
        end = f"os.kill(os.getpid(), {-code})" if code < 0 else f"sys.exit({code})"
        return [PYTHON, "-c", f"import os, sys; {end}"]

    out = io.StringIO()
    jobs = [(f"p{i}", program(code), dict(os.environ)) for i, code in enumerate(codes)]
    assert ProcessGroup(out, grace=30).run(jobs, cwd=tmp_path) == want, out.getvalue()
    assert want == 0 or f"dist-jobs: exit code {want}: " in out.getvalue()


def test_a_rank_that_lost_a_peer_does_not_make_the_launcher_wait_out_the_grace(tmp_path: Path) -> None:
    """p0 exits 200 with no preemption asked for (it lost a peer); p1 is stopped (SIGSTOP) and
    would never exit: nobody is checkpointing, so the launcher kills it after a short wait, not
    after the 120 s grace period, and the verdict names p1's death."""
    from dist_jobs.backends.local.procs import PEER_LOST_WAIT, ProcessGroup

    out = io.StringIO()
    stop = "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGSTOP)"
    jobs = [("p0", [PYTHON, "-c", "import sys, time; time.sleep(2); sys.exit(200)"], dict(os.environ))]
    jobs.append(("p1", [PYTHON, "-c", stop], dict(os.environ)))
    started = time.monotonic()
    code = ProcessGroup(out, grace=120).run(jobs, cwd=tmp_path)
    assert time.monotonic() - started < 2 + PEER_LOST_WAIT + 20, out.getvalue()
    assert code == 200 and "rank killed: killed by SIGKILL (exit 137)" in out.getvalue(), out.getvalue()


def _states(pids: list[int]) -> dict[int, str]:
    """Each live process's state letter (R, S, T, ...), from /proc."""
    found = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        found[pid] = stat[stat.rindex(")") + 2]
    return found


def _ranks_of(launcher: int) -> list[int]:
    keepers = subprocess.run(["pgrep", "-P", str(launcher)], capture_output=True, text=True).stdout.split()
    return [
        int(p)
        for k in keepers
        for p in subprocess.run(["pgrep", "-P", k], capture_output=True, text=True).stdout.split()
    ]


def test_a_stopped_launcher_stops_its_ranks_and_continues_them_when_it_runs_again(tmp_path: Path) -> None:
    """Ctrl-Z stops the launcher alone (each rank runs in a session of its own, which a terminal's
    stop does not reach), and a stopped launcher beats no lock: its keepers stop the ranks with it,
    and continue them when it runs again and still holds the lock."""
    marker = f"djtest-{uuid.uuid4().hex}"
    go = tmp_path / "go"
    waits = textwrap.dedent(f"""\
        import os, pathlib, time
        print("up", os.environ["RANK"], flush=True)
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.05)
        print("done", os.environ["RANK"], flush=True)
        """)
    proc = _start(["--nodes", "1", "--procs-per-node", "2"], tmp_path, marker, waits)
    try:
        _wait_up(proc, 2)
        ranks = _ranks_of(proc.pid)
        assert len(ranks) == 2
        proc.send_signal(signal.SIGSTOP)
        eventually(
            lambda: set(_states(ranks).values()) == {"T"},
            timeout=20,
            what="the ranks stopped with the launcher",
            context=lambda: _states(ranks),
        )
        go.touch()  # a rank that ran on would now finish
        proc.send_signal(signal.SIGCONT)
        eventually(
            lambda: "T" not in _states(ranks).values(),
            timeout=20,
            what="the ranks continued",
            context=lambda: _states(ranks),
        )
        out, _ = proc.communicate(timeout=HUNG_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert sorted(line.split("] ")[1].strip() for line in out.splitlines() if "done" in line) == ["done 0", "done 1"]
