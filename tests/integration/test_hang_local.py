"""The hang watchdog with the real training on the local backend: rank 1 of 2 stops stepping at
step 6 (tests/support/hang_support.py); both ranks dump their threads' stacks into the output and
the launcher, allowed no restart in place here, exits 200 ("run me again"); the same command run
again resumes from the last checkpoint and finishes. Rank 1 SIGSTOPped: only rank 0's watchdog
fires, and the hang record and status name rank 1, the rank that stopped. A run that steps slowly
but steadily, with the same tight watchdog, is left alone; so is a save longer than the limit; a
rank stopped inside a save is named by its silent beat within seconds. Progress: rank 0's progress.json says
how far the run got, and which attempt it is.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from dist_jobs.constants import PREEMPTED_MARKER, REQUEUE_EXIT_CODE
from dist_jobs.rundir.hang import read_hang
from dist_jobs.rundir.progress import read_history, read_progress
from support.paths import PYTHON, REPO, TESTS
from support.specs import tiny_train
from support.tiers import requires
from support.train_support import descendants, rank_of
from support.waiting import eventually

pytestmark = [requires("torch"), pytest.mark.slow, pytest.mark.timeout(420)]

TOTAL = 32  # 128 samples / (2 ranks x batch 4) = 16 steps an epoch, 2 epochs
# The collective timeout well above the watchdog's limit (however slow a loaded machine makes the
# steps), so rank 0's watchdog fires before its all_reduce gives up on the stopped rank.
STALLING = {
    "model": "support.hang_support:stalling_net",
    "hang_min_seconds": 4,
    "hang_factor": 10,
    "collective_timeout": 120,
}
TRAIN = tiny_train(**STALLING, fake_samples=128, epochs=2, seed=5, log_every=2, checkpoint_every_steps=4)


def command(verb: str = "run") -> list[str]:
    sets = [arg for key, value in TRAIN.items() for arg in ("--set", f"train.{key}={value}")]
    return [
        *(PYTHON, "-m", "dist_jobs", verb, "--backend", "local", "--nodes", "1", "--procs-per-node", "2"),
        *("--name", "hang", "--checkpoint-dir", "ckpt", *sets),
        # a hang gives the run up (exit 200) instead of restarting it in place: what is tested here
        # is the rerun's resume and the record; test_local_backend restarts a faulty run in place
        *("--max-restarts", "0"),
        *(["--wait"] if verb == "submit" else []),
    ]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]), "OMP_NUM_THREADS": "1", **extra}


def run(cwd: Path, verb: str = "run", **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(verb),
        cwd=cwd,
        env=env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )


def test_a_rank_that_stops_stepping_is_dumped_requeued_and_the_rerun_resumes(tmp_path: Path) -> None:
    """Slow by nature: the run waits out the watchdog's limit before it dumps the stacks, then runs again to the
    end."""
    run_dir = tmp_path / "ckpt" / "hang"
    stall = {"DJ_TEST_HANG_MARKER": str(tmp_path / "stalled"), "DJ_TEST_HANG_STEP": "7"}
    # Submitted (a detached `dist-jobs run`), so that `dist-jobs status` can tell how it ended.
    first = run(tmp_path, "submit", **stall)
    text = (run_dir / "local" / "output.log").read_text()
    assert (run_dir / "local" / "exit_code").read_text().strip() == str(REQUEUE_EXIT_CODE), text[-5000:]
    assert "hang_support: rank 1 stops stepping at batch 7" in text
    for rank in (0, 1):
        assert re.search(rf"rank {rank}: hang watchdog: no optimizer step completed for \d+ s", text), text[-5000:]
    # faulthandler's dump: the stalled rank's main thread is in the injected sleep, rank 0's in
    # DDP's backward (the gradient all_reduce that waits for rank 1).
    assert "in stop_stepping" in text and text.count("Current thread 0x") == 2, text[-5000:]
    assert (run_dir / PREEMPTED_MARKER).exists()  # what makes the scheduler requeue it
    # ... and why: a hang, not a preemption. The first rank to fire names it (both do).
    # Whichever fired first, the record names rank 1: alive, but in its own code (the injected
    # sleep) while rank 0 waits in a collective.
    hang = read_hang(run_dir)
    assert hang is not None and hang.rank in (0, 1) and (hang.step, hang.attempt) == (6, 0), hang
    assert [s.rank for s in hang.stopped] == [1] and hang.others and hang.compared == 2, hang
    status = subprocess.run(
        [PYTHON, "-m", "dist_jobs", "status", first.stdout.splitlines()[0]], env=env(), capture_output=True, text=True
    )
    host = hang.stopped[0].host  # one node: the firing rank's too
    assert host and host == hang.host, hang
    said = f"hang: rank 1 on {host} stopped at step 6; the others wait in {hang.others}"
    assert f"{said}; to resume from the latest checkpoint (exit {REQUEUE_EXIT_CODE})" in status.stdout, (
        status.stdout + status.stderr
    )
    assert "preempted" not in status.stdout
    progress = read_progress(run_dir)
    assert progress is not None and progress["step"] == 6 and progress["checkpoint_step"] == 4, progress
    assert progress["state"] == "running" and progress["attempt"] == 0

    again = run(tmp_path, **stall)
    assert again.returncode == 0, again.stdout[-5000:]
    assert f"resumed from {run_dir / 'step-4'}" in again.stdout
    assert "hang watchdog" not in again.stdout
    done = read_progress(run_dir)
    assert done is not None and (done["step"], done["state"], done["checkpoint_step"]) == (TOTAL, "finished", TOTAL)
    assert [row["step"] for row in read_history(run_dir)][-1] == TOTAL


def _trainer_of_rank(launcher: int, rank: int) -> int | None:
    """The pid of the training process of `rank` under the local launcher `launcher`, once there."""
    for pid in descendants(launcher):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"dist_jobs.train" in argv and rank_of(pid) == rank:  # not its keeper, which has RANK too
            return pid
    return None


def test_a_sigstopped_rank_is_the_one_the_record_and_status_name_not_the_rank_whose_watchdog_fired(
    tmp_path: Path,
) -> None:
    """Rank 1's whole process stops (its watchdog too): only rank 0's watchdog fires, waiting for it
    in a collective; its beats went stale, so rank 0 names rank 1. The launcher kills the stopped
    rank at once (it would never checkpoint) and exits 200, as for any hang. Step 4 is also a save:
    stopped inside it, rank 0's own clock is paused, and it fires on rank 1's silent beat instead."""
    run_dir = tmp_path / "ckpt" / "hang"
    # Without --wait: submit returns once the launcher is detached; 0.2 s steps: 32 steps take 6 s.
    submit = [arg for arg in command("submit") if arg != "--wait"]
    first = subprocess.run(submit, cwd=tmp_path, env=env(DJ_TEST_STEP_DELAY="0.2"), capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    launcher = int((run_dir / "local" / "pid").read_text().split()[0])  # "PID START"
    log = run_dir / "local" / "output.log"

    def stepping() -> bool:
        progress = read_progress(run_dir)
        return progress is not None and int(str(progress["step"])) >= 4

    eventually(stepping, timeout=120, what="the run at step 4", context=lambda: log.read_text()[-3000:])
    stalled = eventually(lambda: _trainer_of_rank(launcher, 1), timeout=10, what="rank 1's trainer")
    os.kill(stalled, signal.SIGSTOP)
    code = eventually(
        lambda: (run_dir / "local" / "exit_code").read_text().strip(),
        timeout=120,
        what="the launcher's exit code",
        retry_on=(FileNotFoundError,),
        context=lambda: log.read_text()[-3000:],
    )
    text = log.read_text()
    assert code == str(REQUEUE_EXIT_CODE), text[-5000:]
    fired = r"rank 0: hang watchdog: (no optimizer step completed|rank 1 has left no beat for \d+ s while)"
    assert re.search(fired, text), text[-5000:]
    assert "rank 1: hang watchdog: no optimizer step" not in text  # stopped: it never fired
    assert re.search(r"rank 0: hang watchdog: hang: rank 1 on \S+ stopped at step \d+; the others wait in", text)
    hang = read_hang(run_dir)
    assert hang is not None and hang.rank == 0 and hang.compared == 2, hang
    assert [s.rank for s in hang.stopped] == [1] and hang.others, hang
    (gone,) = hang.stopped
    assert gone.step is not None and hang.step is not None and gone.step <= hang.step, hang
    status = subprocess.run(
        [PYTHON, "-m", "dist_jobs", "status", first.stdout.splitlines()[0]], env=env(), capture_output=True, text=True
    )
    assert gone.host and gone.host == hang.host, hang  # one node: the firing rank's too
    said = f"hang: rank 1 on {gone.host} stopped at step {gone.step}; the others wait in {hang.others}"
    assert f"{said}; to resume from the latest checkpoint (exit {REQUEUE_EXIT_CODE})" in status.stdout, (
        status.stdout + status.stderr
    )
    assert not Path(f"/proc/{stalled}").exists() or "Z" in Path(f"/proc/{stalled}/stat").read_text().split(")")[-1][:3]
    assert_the_flight_recorder_trace_of_rank_0_alone(run_dir, text)


def assert_the_flight_recorder_trace_of_rank_0_alone(run_dir: Path, log: str) -> None:
    """Rank 0's watchdog left its flight recorder trace in the run directory, in the format torch's
    own analyser reads (its loader, here), ending in the collective it waits in; rank 1, stopped,
    left none: the missing trace is the stopped rank."""
    from torch.distributed.flight_recorder.components.loader import read_dump

    traces = sorted((run_dir / "flight-recorder").glob("*/rank*"))
    assert [t.name for t in traces] == ["rank0"], traces
    assert f"flight recorder trace: {traces[0]}" in log, log[-3000:]
    dump = read_dump("rank", str(traces[0]))
    last = dump["entries"][-1]  # type: ignore[index]
    assert dump["rank"] == 0 and last["profiling_name"].startswith("gloo:"), last
    assert last["collective_seq_id"] > 4, last  # the step's all_reduce, after the start-up's collectives


def test_a_slow_but_steady_run_is_not_taken_for_a_hang(tmp_path: Path) -> None:
    """Every step takes 0.6 s: longer than a tenth of the floor, far from factor x median."""
    proc = run(tmp_path, DJ_TEST_STEP_DELAY="0.6")
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert "hang watchdog" not in proc.stdout


SLOW_SAVE_JOB = TESTS / "support" / "slow_save_job.py"
SAVE_TAKES = "4"  # seconds: twice the watchdog's limit below


@pytest.mark.parametrize(
    ("slow", "mode"),
    [
        # rank 0's save: the user's state_dict() before the write; rank 1 waits for it meanwhile
        ({"DJ_TEST_SLOW_STATE_S": SAVE_TAKES}, "--no-async-checkpoint"),
        # the async writer: the next save waits for it, and so does the end of the training
        ({"DJ_TEST_SLOW_WRITE_S": SAVE_TAKES}, "--async-checkpoint"),
    ],
    ids=["slow-state-dict", "slow-async-write"],
)
def test_a_checkpoint_longer_than_the_watchdog_limit_is_not_a_hang(
    tmp_path: Path, slow: dict[str, str], mode: str
) -> None:
    from support.train_support import start_ranks, wait_all

    run_dir = tmp_path / "ckpt" / "slow"
    flags = [
        *("--batch-size", "8", "--epochs", "1", "--log-every", "1", "--no-progress", mode),
        *("--checkpoint-every-steps", "3", "--checkpoint-dir", str(tmp_path / "ckpt"), "--run-name", "slow"),
        # limit max(2 x median step, 2 s) = 2 s: the steps take milliseconds
        *("--hang-min-seconds", "2", "--hang-factor", "2"),
    ]
    ranks = start_ranks(flags, tmp_path, command=[PYTHON, str(SLOW_SAVE_JOB)], **slow)
    codes = wait_all(ranks, timeout=240)
    logs = [rank.text() for rank in ranks]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    assert all("hang watchdog" not in text for text in logs), logs
    assert "finished at step 6" in logs[0]  # 96 samples / (2 ranks x 8) = 6 steps, saved at 3 and 6
    assert sorted(p.name for p in run_dir.glob("step-*")) == ["step-3", "step-6"]
    assert not (run_dir / PREEMPTED_MARKER).exists() and not (run_dir / "HANG").exists()


def test_a_rank_stopped_inside_a_save_is_named_by_its_silent_beat_within_seconds(tmp_path: Path) -> None:
    """A user's script (support/slow_save_job.py): rank 1 is SIGSTOPped while it writes its part of
    a checkpoint. The save pauses rank 0's watchdog, and rank 0 waits for rank 1's file, which no
    collective timeout bounds (the checkpointer's finalize_timeout, 600 s, does). Rank 0 watches
    rank 1's beat: silent past the 2 s limit, it fires within seconds, naming rank 1."""
    from support.train_support import start_ranks

    run_dir, marker = tmp_path / "ckpt" / "slow", tmp_path / "rank-1-saving"
    flags = [
        *("--batch-size", "8", "--epochs", "1", "--log-every", "1", "--no-progress", "--no-async-checkpoint"),
        *("--checkpoint-every-steps", "3", "--checkpoint-dir", str(tmp_path / "ckpt"), "--run-name", "slow"),
        *("--hang-min-seconds", "2", "--hang-factor", "2"),
    ]
    slow = {"DJ_TEST_SLOW_WRITE_S": "60", "DJ_TEST_SLOW_RANK": "1", "DJ_TEST_SAVE_MARKER": str(marker)}
    ranks = start_ranks(flags, tmp_path, command=[PYTHON, str(SLOW_SAVE_JOB)], **slow)
    try:
        pid = eventually(
            lambda: int(marker.read_text()),
            timeout=120,
            what="rank 1 inside its save",
            retry_on=(FileNotFoundError, ValueError),
            context=lambda: ranks[1].text()[-2000:],
        )
        os.kill(pid, signal.SIGSTOP)
        code = ranks[0].wait(60)  # not the 600 s of the finalize timeout
    finally:
        for rank in ranks:
            rank.kill()
    text = ranks[0].text()
    assert code == REQUEUE_EXIT_CODE, text[-3000:]
    assert re.search(
        r"rank 0: hang watchdog: rank 1 has left no beat for \d+ s while this rank waits in a checkpoint save", text
    )
    hang = read_hang(run_dir)
    assert hang is not None and hang.rank == 0 and [s.rank for s in hang.stopped] == [1], hang
    assert hang.others == "the checkpoint's commit", hang  # rank 0 polled for rank 1's file
    assert not (run_dir / "step-3" / "COMPLETE").exists()  # nothing of the stopped save counts
