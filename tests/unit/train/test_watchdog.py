"""The hang watchdog (dist_jobs.train.watchdog): a process whose steps stop dumps every thread's
stack to its stderr and exits with the requeue code; a slow but steadily stepping one, one that
is saving a checkpoint, and one that was stopped (SIGSTOP, a SLURM suspend) are left alone.

All but the first test drive it with a hand-wound clock and call its check by hand, as its
thread would every check interval: no thread, no sleep, no timing margin."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
import threading
import types
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from dist_jobs.constants import PREEMPTED_MARKER, REQUEUE_EXIT_CODE
from dist_jobs.rundir.hang import HANG_RECORD, HangRecord, preempted_since, read_hang, read_preempted
from dist_jobs.spec.train import TrainConfig
from dist_jobs.train.watchdog import Watchdog, waits_in
from support.paths import PYTHON, REPO
from support.tiers import requires
from support.waiting import HUNG_S

STALLS = textwrap.dedent(
    """
    import logging, logging.handlers, sys, threading, time
    from pathlib import Path
    from dist_jobs.train.watchdog import Watchdog, waits_in

    def helper_thread_waits():
        time.sleep(600)

    def stuck_in_a_collective():
        time.sleep(600)  # what a rank waiting for a peer that stopped stepping looks like

    marker, log_file = Path(sys.argv[1]), sys.argv[2]
    # A handler that buffers far more than is logged here: only a flush gets its lines to the file.
    to_file = logging.handlers.MemoryHandler(1000, target=logging.FileHandler(log_file), flushOnClose=False)
    logging.basicConfig(level=logging.INFO, handlers=[to_file])
    threading.Thread(target=helper_thread_waits, name="loader", daemon=True).start()
    with Watchdog(3.0, 1.0, rank=1, on_fire=lambda dog: marker.write_text(f"hang at step {dog.step}")) as dog:
        for step in range(1, 6):
            time.sleep(0.05)
            dog.beat(step)
        print("stepped 5 times")  # stdout into a pipe: block-buffered, not flushed here
        logging.getLogger("dist_jobs.train").info("the last line before the stall")
        stuck_in_a_collective()
    print("not reached", flush=True)
    """
)


def test_a_stalled_process_dumps_every_threads_stack_flushes_its_logs_and_exits_to_be_requeued(tmp_path: Path) -> None:
    marker, log_file = tmp_path / "PREEMPTED", tmp_path / "train.log"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [PYTHON, "-c", STALLS, str(marker), str(log_file)], env=env, capture_output=True, text=True, timeout=HUNG_S
    )
    assert proc.returncode == REQUEUE_EXIT_CODE == 200, proc.stderr
    assert "dist-jobs: rank 1: hang watchdog: no optimizer step completed for" in proc.stderr
    assert "limit 1 s = max(3 x median step" in proc.stderr and f"exit {REQUEUE_EXIT_CODE}" in proc.stderr
    # faulthandler's dump of all threads: the stuck main thread, the helper, the watchdog itself.
    assert proc.stderr.count("Thread 0x") == 2 and "Current thread 0x" in proc.stderr, proc.stderr
    assert "in stuck_in_a_collective" in proc.stderr and "in helper_thread_waits" in proc.stderr
    assert marker.read_text() == "hang at step 5"  # what the batch script and the pod entrypoint read as "requeue"
    # os._exit flushes nothing: the buffered stdout and log lines got out because the watchdog
    # flushed them, and the log ends with the dump and the exit line.
    assert proc.stdout == "stepped 5 times\n"
    assert "the last line before the stall" in log_file.read_text()
    lines = proc.stderr.rstrip("\n").splitlines()
    assert lines[-1] == f"dist-jobs: rank 1: hang watchdog: exiting with {REQUEUE_EXIT_CODE} to be requeued"
    assert lines[-2] == "dist-jobs: rank 1: end of the stacks"


class Clock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def watched(factor: float, floor: float, **options: Any) -> tuple[Watchdog, Clock, list[int], io.StringIO]:
    """A watchdog on a hand-wound clock that checks every second, lingers 0 s and records its exit."""
    clock, exits, out = Clock(), cast(list[int], []), io.StringIO()
    options = {"check_every_s": 1.0, "linger_s": 0.0, "exit": exits.append, "stream": out, **options}
    dog = Watchdog(factor, floor, clock=clock, **options)
    return dog, clock, exits, out


def wait(dog: Watchdog, clock: Clock, seconds: float) -> bool:
    """`seconds` pass with the thread checking every second, as it does; whether it fired."""
    for _ in range(int(seconds)):
        clock.advance(1.0)
        if dog.check():
            return True
    return False


def test_a_slow_but_stepping_run_is_left_alone() -> None:
    dog, clock, exits, out = watched(3.0, 30.0)
    dog.beat()
    # Steps slower than the floor, slowing down, but each within factor x the median so far.
    for pause in (20, 25, 35, 45, 60, 50, 40):
        assert not wait(dog, clock, pause)
        dog.beat()
    assert not dog.fired and exits == [] and out.getvalue() == ""
    assert dog.limit() == 3 * 40  # the median of the seven steps
    assert wait(dog, clock, 3 * 40 + 1) and exits == [REQUEUE_EXIT_CODE]


def test_nothing_is_watched_before_the_first_step_and_evaluation_touches_it() -> None:
    dog, clock, exits, _ = watched(2.0, 20.0)
    assert not wait(dog, clock, 500)  # start-up, resume, compile: no step yet, nothing to compare with
    dog.beat()
    for _ in range(10):  # evaluation batches: progress, not steps
        assert not wait(dog, clock, 10)
        dog.touch()
    assert not wait(dog, clock, 20)
    assert wait(dog, clock, 1) and exits == [REQUEUE_EXIT_CODE]


def test_a_checkpoint_save_or_wait_never_fires_it_however_long_and_it_fires_again_after_one() -> None:
    dog, clock, exits, _ = watched(10.0, 60.0)
    for _ in range(5):
        clock.advance(1.0)
        dog.beat()
    with dog.paused():  # a save: state_dict(), the write, rank 0's commit
        assert not wait(dog, clock, 3 * 3600)
        with dog.paused():  # the async writer's wait inside it
            assert not wait(dog, clock, 3600)
        assert not wait(dog, clock, 3600)  # still in the outer one
    # No step follows: the clock restarted when the save ended, and the limit applies again.
    assert not wait(dog, clock, 60)
    assert wait(dog, clock, 1) and exits == [REQUEUE_EXIT_CODE]


@requires("torch")
def test_the_limit_stays_below_the_collective_timeout_for_a_60_s_step() -> None:
    from dist_jobs.train.distributed import collective_timeout
    from dist_jobs.train.live import watchdog

    config = TrainConfig()  # factor 20, floor 300 s
    timeout = collective_timeout(config, timedelta(seconds=300), {}).total_seconds()
    assert timeout == 600
    clock, exits = Clock(), cast(list[int], [])
    dog = watchdog(config, 0, None, timeout, clock=clock, exit=exits.append, stream=io.StringIO(), linger_s=0.0)
    assert dog is not None and dog.cap is not None
    for _ in range(10):
        clock.advance(60.0)
        dog.beat()
    assert dog.wanted() == 20 * 60  # what the step time alone would allow
    assert dog.limit() == dog.cap < timeout
    # Firing takes a check at most, then the linger (its default here: three checks), before the exit.
    check_every = 1.0  # floor 300 s: the default check interval
    assert dog.cap + check_every + 3 * check_every < timeout - 10
    clock.advance(dog.cap - 1)
    assert not dog.check()
    clock.advance(2.0)
    assert dog.check() and exits == [REQUEUE_EXIT_CODE]


@requires("torch")
def test_a_floor_too_close_to_the_collective_timeout_is_clamped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from dist_jobs.train.live import watchdog

    with caplog.at_level(logging.WARNING, logger="dist_jobs.train"):
        dog = watchdog(TrainConfig(hang_min_seconds=590), 0, None, 600.0, stream=io.StringIO())
    assert dog is not None and dog.cap is not None and dog.limit() == dog.cap < 590
    assert "train.hang_min_seconds is 590s" in caplog.text and "train.collective_timeout" in caplog.text
    assert "DIST_JOBS_COLLECTIVE_TIMEOUT" in caplog.text


def test_a_floor_at_or_above_the_collective_timeout_is_refused_naming_both() -> None:
    from dist_jobs.errors import SpecError
    from dist_jobs.spec.load import load_spec

    base = {"name": "t", "nodes": 1, "procs_per_node": 2, "image": "reg.example/t:1"}
    with pytest.raises(SpecError) as refused:
        load_spec(data={**base, "train": {"hang_min_seconds": 600, "collective_timeout": 600}})
    text = str(refused.value)
    assert "train.hang_min_seconds" in text and "train.collective_timeout" in text
    assert "DIST_JOBS_COLLECTIVE_TIMEOUT" in text and "at least 1200" in text
    load_spec(data={**base, "train": {"hang_min_seconds": 600, "hang_watchdog": False, "collective_timeout": 60}})
    # The trainer's own flags: exit 2, naming the flags.
    proc = subprocess.run(
        [PYTHON, "-m", "dist_jobs.train", "--hang-min-seconds=900", "--collective-timeout=600"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=HUNG_S,
    )
    assert proc.returncode == 2, proc.stderr
    assert "--hang-min-seconds" in proc.stderr and "--collective-timeout" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_time_the_process_spent_stopped_does_not_count() -> None:
    dog, clock, exits, out = watched(10.0, 60.0)
    for _ in range(5):
        clock.advance(1.0)
        dog.beat()
    assert not wait(dog, clock, 30)
    clock.advance(4 * 3600)  # SIGSTOP, a SLURM suspend: the thread's next wake-up comes hours late
    assert not dog.check() and exits == []
    assert out.getvalue().count("\n") == 1  # one line says so
    assert "woke up 14400 s after its previous check" in out.getvalue() and "stopped" in out.getvalue()
    # The clock restarted at the wake-up: a whole limit from there, not the 30 s before the stop.
    assert not wait(dog, clock, 60)
    assert wait(dog, clock, 1) and exits == [REQUEUE_EXIT_CODE]


def test_a_late_wake_up_well_within_ten_checks_still_counts() -> None:
    dog, clock, exits, out = watched(10.0, 60.0)
    dog.beat()
    clock.advance(9.0)  # a busy machine, not a stopped process
    assert not dog.check() and out.getvalue() == ""
    assert not wait(dog, clock, 51)
    assert wait(dog, clock, 1) and exits == [REQUEUE_EXIT_CODE]


@requires("torch")
def test_firing_leaves_the_hang_record_and_the_requeue_marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dist_jobs.train.live import host_name, watchdog

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    # No flight recorder trace here: the trace is the hang test's (tests/integration/test_hang_local.py).
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    stamp = tmp_path / "start"  # the batch script's stamp of this attempt's start, a while ago
    stamp.touch()
    os.utime(stamp, (stamp.stat().st_atime - 60, stamp.stat().st_mtime - 60))
    started = stamp.stat().st_mtime
    clocks, exits = [Clock(), Clock()], cast(list[int], [])
    config = TrainConfig(hang_min_seconds=10)
    dogs = []
    for rank in (0, 1):
        dog = watchdog(
            config, rank, tmp_path, 600.0, None, 2, clock=clocks[rank], exit=exits.append, stream=io.StringIO()
        )
        assert dog is not None
        dog.beat(6)
        dog.tick()  # each leaves its beat, as its thread does before every check
        dogs.append(dog)
    for rank in (1, 0):  # both stopped stepping at step 6; rank 1 fires first, rank 0 a moment later
        clocks[rank].advance(11.0)
        assert dogs[rank].check()
    assert exits == [REQUEUE_EXIT_CODE] * 2
    found = read_hang(tmp_path)
    assert found is not None and (found.rank, found.step, found.attempt, found.job) == (1, 6, 2, "4242")
    # Their beats: both fresh, at the same step, no thread to look into: none stopped before the other.
    assert (found.stopped, found.compared, found.host) == ((), 2, host_name())
    assert found.belongs_to(job="4242", attempt=2) and not found.belongs_to(job="4242", attempt=1)
    # The marker every backend's verdict reads as this attempt's (newer than the attempt's start),
    # through the one test of it they all ask; a stamp taken after it does not count it.
    marker = read_preempted(tmp_path)
    assert marker is not None and marker.why == (
        "hang: all 2 ranks stopped at step 6, none before the others (rank 0's watchdog fired)"
    )
    assert preempted_since(tmp_path, started)
    assert not preempted_since(tmp_path, (tmp_path / PREEMPTED_MARKER).stat().st_mtime + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [HANG_RECORD, PREEMPTED_MARKER, "beats", "start"]
    assert sorted(p.name for p in (tmp_path / "beats").iterdir()) == ["rank-0.json", "rank-1.json"]  # no temporaries


def test_a_hang_record_of_an_earlier_attempt_is_replaced(tmp_path: Path) -> None:
    from dist_jobs.rundir.hang import write_hang

    write_hang(tmp_path, HangRecord(rank=3, step=9, time=1.0, attempt=0, job="7"))
    write_hang(tmp_path, HangRecord(rank=1, step=4, time=2.0, attempt=1, job="7"))
    write_hang(tmp_path, HangRecord(rank=0, step=4, time=3.0, attempt=1, job="7"))  # same attempt: first stays
    assert read_hang(tmp_path) == HangRecord(rank=1, step=4, time=2.0, attempt=1, job="7")
    (tmp_path / HANG_RECORD).write_text("{not json")
    assert read_hang(tmp_path) is None


class Flushes(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.flushed = 0

    def emit(self, record: logging.LogRecord) -> None:
        pass

    def flush(self) -> None:
        self.flushed += 1


class Stream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushed = 0

    def flush(self) -> None:
        self.flushed += 1


def test_every_log_handler_and_both_standard_streams_are_flushed_before_the_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handler, stdout, stderr = Flushes(), Stream(), Stream()
    logger = logging.getLogger("dist_jobs.train.test_flush")
    logger.addHandler(handler)
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", stderr)
    flushed_at_exit: list[tuple[int, int, int]] = []

    def exit(code: int) -> None:
        flushed_at_exit.append((handler.flushed, stdout.flushed, stderr.flushed))

    try:
        dog, clock, _, out = watched(2.0, 10.0, exit=exit)
        dog.beat()
        clock.advance(11.0)
        assert dog.check()
    finally:
        logger.removeHandler(handler)
    assert len(flushed_at_exit) == 1 and all(count > 0 for count in flushed_at_exit[0]), flushed_at_exit
    assert out.getvalue().endswith(f"exiting with {REQUEUE_EXIT_CODE} to be requeued\n")


class Beats:
    """What _save and _stop do to the watchdog meanwhile: an hour passes at each call."""

    def __init__(self, dog: Watchdog, clock: Clock) -> None:
        self.dog, self.clock, self.calls = dog, clock, 0

    def __call__(self, *_args: object) -> None:
        self.calls += 1
        assert not wait(self.dog, self.clock, 3600), "the watchdog fired during a checkpoint"


def _run(dog: Watchdog, clock: Clock, tmp_path: Path) -> Any:
    """A run at the boundary after step 8, where all ranks agreed that one was told to stop."""
    slow = Beats(dog, clock)
    run = types.SimpleNamespace(
        watchdog=dog,
        config=types.SimpleNamespace(checkpoint_every_steps=None, checkpoint_every_minutes=None),
        poll=types.SimpleNamespace(result=lambda: [True, False, False]),
        ckpt=types.SimpleNamespace(save=slow, wait=slow, async_write=True, directory=tmp_path),
        dist=types.SimpleNamespace(is_main=False, rank=1, barrier=slow),
        pos=types.SimpleNamespace(step=8),
        saved_step=4,
        live=types.SimpleNamespace(checkpoint_step=None, stepped=lambda step: None, saved=lambda step, blocked_s: None),
        flag=types.SimpleNamespace(received=None),
    )
    return run, slow


@requires("torch")
def test_the_trainers_save_and_preemption_wait_pause_it(tmp_path: Path) -> None:
    from dist_jobs.train import loop

    dog, clock, exits, _ = watched(10.0, 60.0)
    dog.beat(7)
    clock.advance(1.0)
    dog.beat(8)
    run, slow = _run(dog, clock, tmp_path)
    with pytest.raises(loop.Preempted):
        # The preemption checkpoint: its save (with the wait for the previous write) and the
        # barrier after it, then the wait for its own write and the barrier all ranks leave by.
        loop._boundary(run)
    assert slow.calls == 4 and run.saved_step == 8 and exits == []
    assert not wait(dog, clock, 60)
    assert wait(dog, clock, 1) and exits == [REQUEUE_EXIT_CODE]


def test_the_templates_give_collectives_a_timeout_the_watchdog_beats() -> None:
    from dist_jobs.spec.env import job_env
    from dist_jobs.spec.load import load_spec

    base = {"name": "t", "nodes": 2, "procs_per_node": 2, "image": "reg.example/t:1"}
    for backend in ("slurm", "k8s", "local"):
        env = job_env(load_spec(data=base), backend)
        assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["DIST_JOBS_COLLECTIVE_TIMEOUT"]) == ("1", "600")
    tight = load_spec(data={**base, "train": {"hang_min_seconds": 45.5}})
    assert job_env(tight, "slurm")["DIST_JOBS_COLLECTIVE_TIMEOUT"] == "91"
    chosen = load_spec(data={**base, "train": {"collective_timeout": 1800, "hang_watchdog": False}})
    assert job_env(chosen, "k8s")["DIST_JOBS_COLLECTIVE_TIMEOUT"] == "1800"
    off = load_spec(data={**base, "train": {"hang_watchdog": False}})
    assert "DIST_JOBS_COLLECTIVE_TIMEOUT" not in job_env(off, "slurm")


@requires("torch")
def test_collective_timeout_prefers_the_field_then_the_template_then_twice_the_floor() -> None:
    from dist_jobs.train.distributed import collective_timeout

    rdzv = timedelta(seconds=300)
    env = {"DIST_JOBS_COLLECTIVE_TIMEOUT": "900"}
    assert collective_timeout(TrainConfig(collective_timeout=42.0), rdzv, env) == timedelta(seconds=42)
    assert collective_timeout(TrainConfig(), rdzv, env) == timedelta(seconds=900)
    assert collective_timeout(TrainConfig(), rdzv, {}) == timedelta(seconds=600)  # 2 x hang_min_seconds
    assert collective_timeout(TrainConfig(hang_min_seconds=10.0), rdzv, {}) == rdzv  # never below the rendezvous
    assert collective_timeout(TrainConfig(hang_watchdog=False), rdzv, {"DIST_JOBS_COLLECTIVE_TIMEOUT": "x"}) == rdzv


# Where a blocked main thread's innermost frames come from, as compiled by torch and dist-jobs.
WAITS = textwrap.dedent(
    """
    def outer(entered, release):
        return blocked(entered, release)

    def {name}(entered, release):
        entered.set()
        release.wait()
    """
)


@pytest.mark.parametrize(
    "path,name,said",
    [
        ("site-packages/torch/distributed/distributed_c10d.py", "all_reduce", "all_reduce"),
        ("site-packages/torch/autograd/graph.py", "_engine_run_backward", "backward"),
        # a peer stopped between two steps: the others block in DDP's forward, broadcasting buffers
        ("site-packages/torch/nn/parallel/distributed.py", "_distributed_broadcast_coalesced", "broadcast"),
        ("site-packages/torch/nn/parallel/distributed.py", "forward", ""),  # computing, not waiting
        ("dist_jobs/train/distributed.py", "max_over_ranks", "all_reduce"),
        # a peer stopped mid-save: rank 0's commit polls for its file, outside any collective
        ("dist_jobs/train/checkpoint/checkpointer.py", "_await_ranks", "the checkpoint's commit"),
        ("site-packages/my_loader.py", "read", ""),
    ],
)
def test_what_a_blocked_thread_waits_in_is_named_by_its_innermost_known_frame(path: str, name: str, said: str) -> None:
    scope: dict[str, Any] = {}
    exec(compile(WAITS.format(name=name).replace("blocked(", f"{name}("), f"/venv/{path}", "exec"), scope)
    entered, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=scope["outer"], args=(entered, release), daemon=True)
    thread.start()
    try:
        assert entered.wait(10)
        assert waits_in(thread.ident) == said
    finally:
        release.set()
        thread.join(10)
    assert waits_in(None) is None
