"""dist_jobs.backends.slurm.stepwatch: a step's srun that outlives its step is ended, and the
verdict reads why. The steps come from scontrol output captured on the project's cluster
(tests/fixtures/slurm/INDEX.md); the looks are driven by hand: no scontrol, no sleep."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

import pytest

from dist_jobs.backends.slurm.step_end import evidence
from dist_jobs.backends.slurm.stepwatch import EVERY_S, interval, parse_steps, step_lost, watch
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lock import acquire, new_token
from dist_jobs.rundir.verdict import Action, Ending, decide
from support.paths import TESTS

FIXTURES = TESTS / "fixtures" / "slurm"
SRUN = 18054  # the srun pid in scontrol_show_step_running.txt


def fixture(name: str) -> dict[int, str]:
    return parse_steps((FIXTURES / name).read_text())


def test_steps_are_found_by_their_sruns_pid_and_the_batch_step_has_none() -> None:
    assert fixture("scontrol_show_step_running.txt") == {SRUN: "1024.0"}
    assert fixture("scontrol_show_step_batch_only.txt") == {}
    assert fixture("scontrol_show_step_job_gone.txt") == {}  # "Job step 1024. not found"


class Scene:
    """srun alive for as long as the test says; each look answers the next captured output."""

    def __init__(self, looks: list[dict[int, str] | None]) -> None:
        self.looks, self.killed, self.slept = list(looks), [], 0

    def show(self, job: str) -> dict[int, str] | None:
        assert job == "1024"
        return self.looks.pop(0)

    def alive(self, pid: int) -> bool:
        return bool(self.looks) and not self.killed

    def kill(self, pid: int, sig: int) -> None:
        self.killed.append((pid, sig))

    def sleep(self, seconds: float) -> None:
        self.slept += 1


def run(scene: Scene, errors: Path) -> bool:
    return watch("1024", SRUN, errors, 30.0, scene.show, scene.alive, scene.kill, scene.sleep)


def test_a_srun_whose_step_is_gone_for_two_looks_is_killed_and_says_why(tmp_path: Path) -> None:
    errors = tmp_path / "srun.err"
    errors.write_text("srun: error: n2: task 2: Killed\n")  # srun's own lines stay first
    running, gone = fixture("scontrol_show_step_running.txt"), fixture("scontrol_show_step_batch_only.txt")
    scene = Scene([running, running, gone, None, gone, running])  # None: scontrol did not answer
    assert run(scene, errors)
    assert scene.killed == [(SRUN, signal.SIGKILL)] and scene.looks == [running]
    told = step_lost(errors.read_text())
    assert told.startswith("step 1024.0 ended at SLURM at least 60 s ago, but its srun (pid 18054) never heard")
    assert errors.read_text().startswith("srun: error: n2: task 2: Killed\n")


@pytest.mark.parametrize(
    "looks",
    [
        ["running", "running", "batch_only"],  # srun ended a moment after its step: one missed look
        ["batch_only", "batch_only", "batch_only"],  # srun's step not created yet: never seen, never killed
        ["running", None, None, None, "running"],  # scontrol not answering is not a missing step
    ],
)
def test_a_srun_that_ends_by_itself_or_a_step_not_yet_seen_is_left_alone(tmp_path: Path, looks: list) -> None:
    names = {"running": "scontrol_show_step_running.txt", "batch_only": "scontrol_show_step_batch_only.txt"}
    scene = Scene([None if look is None else fixture(names[look]) for look in looks])
    assert not run(scene, tmp_path / "srun.err")
    assert scene.killed == [] and scene.looks == [] and not (tmp_path / "srun.err").exists()


def test_the_verdict_of_a_step_whose_srun_was_ended_is_a_lost_peer_restarted_in_place(tmp_path: Path) -> None:
    errors = tmp_path / "srun.err"
    scene = Scene([fixture("scontrol_show_step_running.txt"), {}, {}, {}])
    assert run(scene, errors)
    lock = acquire(tmp_path / "run", Holder.this(new_token(), "slurm:1024", "slurm", "1024"))
    args = argparse.Namespace(
        rc=137, errors=errors, since=tmp_path / "start", run_dir=tmp_path / "run", token=lock.token
    )
    args.warned = args.cancelled = args.tasks_are_nodes = False
    verdict = decide(evidence(args), restarts_left=1)
    assert (verdict.ending, verdict.action, verdict.exit_code) == (Ending.PEER_LOST, Action.RESTART, 200), verdict
    assert "srun (pid 18054) never heard its tasks end" in verdict.told()


def test_the_interval_comes_from_the_environment_or_the_default() -> None:
    assert interval("") == EVERY_S and interval("2.5") == 2.5
    assert interval("0") == EVERY_S and interval("soon") == EVERY_S
