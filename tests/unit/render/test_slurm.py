"""The sbatch script: directives, launch lines, requeue logic, bash -n and shellcheck."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.constants import REQUEUE_LIMIT_EXIT_CODE
from dist_jobs.errors import SpecError
from dist_jobs.render import render
from dist_jobs.spec.load import load_spec
from support.paths import REPO
from support.render_helpers import make_stubs, run_script, step_calls
from support.specs import SLURM_SEED as SEED
from support.tiers import require_tool


def directives(script: str) -> list[str]:
    return [line[len("#SBATCH ") :] for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_seed_directives_sorted() -> None:
    got = directives(render(load_spec(data=SEED), "slurm"))
    assert got == sorted(got)
    for want in (
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--cpus-per-task=8",
        "--mem=256G",
        "--time=04:00:00",
        "--partition=gpu",
        "--account=ml",
        "--requeue",
        "--open-mode=append",
        "--signal=B:USR1@120",
        "--job-name=resnet50-ddp",
        "--output=logs/%x-%j.out",
    ):
        assert want in got, want


def test_torchrun_mode_one_task_per_node() -> None:
    spec = load_spec(data={**SEED, "launcher": "torchrun"})
    script = render(spec, "slurm")
    got = directives(script)
    assert "--ntasks-per-node=1" in got and "--cpus-per-task=32" in got
    assert "--nproc-per-node=4" in script and '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"' in script
    assert '--rdzv-id="$SLURM_JOB_ID.$restart"' in script and "-m dist_jobs.train" in script


def test_quoted_values_and_percent_in_log_dir() -> None:
    spec = load_spec(data={**SEED, "log_dir": "my logs/100%", "slurm": {"constraint": "a100&ib", "partition": "gpu"}})
    got = directives(render(spec, "slurm"))
    assert "--output='my logs/100%%/%x-%j.out'" in got
    assert "--constraint='a100&ib'" in got


def test_gres_and_array_forms() -> None:
    spec = load_spec(data={**SEED, "slurm": {"gpus_flag": "gres", "array": "0-3%2"}})
    script = render(spec, "slurm")
    got = directives(script)
    assert "--gres=gpu:4" in got and "--array=0-3%2" in got and "--output=logs/%x-%A_%a.out" in got
    assert "SLURM_ARRAY_TASK_ID" in script


def test_render_is_deterministic() -> None:
    spec = load_spec(data=SEED)
    assert render(spec, "slurm") == render(spec, "slurm")


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_bash_n_and_shellcheck(tmp_path, launcher: str) -> None:
    script = render(load_spec(data={**SEED, "launcher": launcher, "setup": ["module load cuda"]}), "slurm")
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    shellcheck = require_tool("shellcheck")
    proc = subprocess.run([shellcheck, "-s", "bash", "-S", "warning", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_head_node_from_nodelist_and_derived_port(tmp_path) -> None:
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    proc, calls = run_script(render(load_spec(data=SEED), "slurm"), tmp_path, stubs)
    assert proc.returncode == 0, proc.stderr
    (srun,) = step_calls(calls)
    assert srun["env"]["MASTER_ADDR"] == "gpu007"  # never localhost
    port = int(srun["env"]["MASTER_PORT"])
    assert 1024 <= port <= 65535
    assert srun["env"]["DIST_JOBS_CHECKPOINT_DIR"] == str(tmp_path / "checkpoints")
    assert srun["argv"][-3:] == ["python3", "-m", "dist_jobs.train"]
    assert any(a.startswith("--output=") and a.endswith("-attempt0-rank%t.out") for a in srun["argv"])


@pytest.mark.parametrize("ckpt", ["ck\n", "ck \n\n", "/abs/ck\n"])
def test_checkpoint_dir_reaches_the_job_exactly(tmp_path, ckpt: str) -> None:
    """A trailing newline once vanished in the script's $(...) while the pod and the trainer kept it."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    spec = load_spec(data={**SEED, "checkpoint_dir": ckpt if ckpt[0] != "/" else str(tmp_path) + ckpt})
    proc, calls = run_script(render(spec, "slurm"), tmp_path, stubs)
    assert proc.returncode == 0, proc.stderr
    (srun,) = step_calls(calls)
    want = str(tmp_path / ckpt) if ckpt[0] != "/" else str(tmp_path) + ckpt
    assert srun["env"]["DIST_JOBS_CHECKPOINT_DIR"] == want


KILLED = "srun: error: gpu008: task 3: Killed\nsrun: error: gpu007: tasks 0-2: Terminated"


def scontrol_calls(calls: list[dict]) -> list[list[str]]:
    return [c["argv"] for c in calls if c["prog"] == "scontrol"]


def verdicts(workdir: Path) -> list[dict]:
    """The verdicts the script recorded for job 4242 (the SEED's run directory)."""
    (path,) = (workdir / "checkpoints").glob("*/verdicts/4242.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_programs_own_exit_fails_at_once_naming_the_rank(tmp_path) -> None:
    """srun stops the others when rank 1 exits 3 and itself exits 143: the verdict reads srun's
    lines, not the step's code, so the job fails once with the rank's code and is never requeued."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    errs = "srun: error: gpu007: task 1: Exited with exit code 3\nsrun: error: gpu007: tasks 0,2-3: Terminated"
    proc, calls = run_script(render(load_spec(data=SEED), "slurm"), tmp_path, stubs, {"STUB_ERRS": errs}, rc=143)
    assert proc.returncode == 3 and scontrol_calls(calls) == [] and len(step_calls(calls)) == 1, proc.stderr
    assert "ended: the program failed: rank 1 exit 3 on gpu007; failed at once" in proc.stderr
    (verdict,) = verdicts(tmp_path)
    assert (verdict["ending"], verdict["action"], verdict["rank"], verdict["node"]) == (
        "program error",
        "fail",
        1,
        "gpu007",
    )


def test_a_killed_rank_restarts_in_place_and_is_never_requeued(tmp_path) -> None:
    """Rank 3 SIGKILLed (the OOM killer, an admin): both nodes answer the probe, so the step runs
    again in the same allocation on a fresh port, and its success ends the job."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    env = {"STUB_RCS": "137,0", "STUB_ERRS": KILLED + "|"}
    proc, calls = run_script(render(load_spec(data=SEED), "slurm"), tmp_path, stubs, env)
    assert proc.returncode == 0 and scontrol_calls(calls) == [], proc.stdout + proc.stderr
    first, second = step_calls(calls)
    assert first["env"]["MASTER_PORT"] != second["env"]["MASTER_PORT"]
    assert "attempt0.1-rank%t.out" in " ".join(second["argv"])
    assert "restarting in place: restart 1 of at most 3" in proc.stdout
    assert [(v["ending"], v["action"], v["attempt"]) for v in verdicts(tmp_path)] == [
        ("rank killed", "restart", "0"),
        ("completed", "done", "0.1"),
    ]


def test_restarts_used_up_or_a_silent_node_give_the_allocation_up(tmp_path) -> None:
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    spec = load_spec(data={**SEED, "preemption": {"max_restarts": 1}})
    proc, calls = run_script(render(spec, "slurm"), tmp_path, stubs, {"STUB_RCS": "137", "STUB_ERRS": KILLED}, rc=137)
    assert proc.returncode == 200 and len(step_calls(calls)) == 2, proc.stderr
    # the killed rank's node is kept away from the next attempt: excluded once the job is requeued
    show, requeue = ["show", "job", "-o", "4242"], ["requeue", "4242"]
    assert scontrol_calls(calls) == [show, requeue, ["update", "JobId=4242", "ExcNodeList=gpu008"]]
    # gpu008 answers the check before the step, not the one after it: requeued at once, no
    # restart on a broken allocation
    env = {"STUB_RCS": "137", "STUB_ERRS": KILLED, "STUB_NODES": "gpu007,gpu008|gpu007"}
    (tmp_path / "b").mkdir()  # another run directory: no quarantine of the first run's
    proc, calls = run_script(render(load_spec(data=SEED), "slurm"), tmp_path / "b", stubs, env)
    assert proc.returncode == 200 and len(step_calls(calls)) == 1, proc.stderr
    assert scontrol_calls(calls) == [show, requeue, ["update", "JobId=4242", "ExcNodeList=gpu008"]]
    assert "ended: node lost: gpu008 no longer answered; to resume from the latest checkpoint" in proc.stderr
    assert "the next attempt keeps away from gpu008 (gpu008 no longer answered; until " in proc.stderr


def test_a_node_that_fails_its_check_ends_the_attempt_before_any_rank_starts(tmp_path) -> None:
    """gpu008 answers, but its run directory is not the batch host's (its shared filesystem is not
    mounted): no step starts, the job is requeued keeping gpu008 away, the verdict names it."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    why = "its /ck is not the directory the batch host sees (no shared filesystem mounted there, or a stale mount)"
    proc, calls = run_script(render(load_spec(data=SEED), "slurm"), tmp_path, stubs, {"STUB_UNFIT": f"gpu008:{why}"})
    assert proc.returncode == 200 and step_calls(calls) == [], proc.stderr
    (check,) = [c for c in calls if c["prog"] == "srun"]
    assert check["argv"][-5:-2] == [
        "-m",
        "dist_jobs.backends.slurm.nodecheck",
        str(tmp_path / "checkpoints" / "resnet50-ddp"),
    ]
    show, requeue = ["show", "job", "-o", "4242"], ["requeue", "4242"]
    assert scontrol_calls(calls) == [show, requeue, ["update", "JobId=4242", "ExcNodeList=gpu008"]]
    assert f"attempt 0 ended: node unfit: gpu008 {why}; to resume from the latest checkpoint" in proc.stderr
    assert [(v["ending"], v["action"], v["node"]) for v in verdicts(tmp_path)] == [("node unfit", "requeue", "gpu008")]
    assert not (tmp_path / "checkpoints" / "resnet50-ddp" / ".nodecheck").exists()  # the nonce is gone again


def test_requeue_after_a_preemption_checkpoint(tmp_path) -> None:
    """The trainer's PREEMPTED marker, newer than the step's start: requeued, never restarted here."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    (stubs / "srun").write_text('#!/bin/sh\ntouch "$DIST_JOBS_CHECKPOINT_DIR/$DIST_JOBS_RUN/PREEMPTED"\nexit 200\n')
    proc, calls = run_script(render(load_spec(data=SEED), "slurm"), tmp_path, stubs)
    assert proc.returncode == 200 and scontrol_calls(calls) == [["requeue", "4242"]], proc.stderr
    # the first attempt (SLURM_RESTART_COUNT 0) asks for the first requeue, not "attempt 0"
    assert "dist-jobs: requeueing job 4242: requeue 1 of at most 3\n" in proc.stdout, proc.stdout
    spec = load_spec(data={**SEED, "preemption": {"max_requeues": 5}})
    proc, _ = run_script(render(spec, "slurm"), tmp_path, stubs, {"SLURM_RESTART_COUNT": "2"})
    assert "dist-jobs: requeueing job 4242: requeue 3 of at most 5\n" in proc.stdout, proc.stdout
    spec = load_spec(data={**SEED, "preemption": {"max_requeues": 2}})
    proc, calls = run_script(render(spec, "slurm"), tmp_path, stubs, {"SLURM_RESTART_COUNT": "2"})
    assert proc.returncode == 200 and scontrol_calls(calls) == []
    assert "maximum of 2 requeues" in proc.stderr


def test_a_step_slurm_ended_is_left_to_slurm(tmp_path) -> None:
    """A scancel or an external requeue (TERM to the batch shell) is SLURM's decision: no
    restart, no requeue from the script."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    (stubs / "srun").write_text("#!/bin/sh\nkill -TERM $PPID\nexit 143\n")  # scancel: TERM to the shell too
    proc, calls = run_script(render(load_spec(data=SEED), "slurm"), tmp_path, stubs)
    assert proc.returncode == 143 and scontrol_calls(calls) == [], proc.stdout
    assert "ended: cancelled" in proc.stderr


def test_restart_cap_counted_in_the_run_directory(tmp_path) -> None:
    """Requeues from outside the script (scontrol requeue, preemption) count too: past max_requeues
    the script refuses to start with REQUEUE_LIMIT_EXIT_CODE; a new submission starts afresh."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    # no restarts in place: each step's end (a peer lost, as no marker says preempted) requeues at once
    preemption = {"max_requeues": 1, "max_restarts": 0}
    script = render(load_spec(data={**SEED, "preemption": preemption}), "slurm")
    for attempt in range(2):  # the first start and one requeue, as SLURM_RESTART_COUNT never says
        proc, calls = run_script(script, tmp_path, stubs, rc=200)
        assert proc.returncode == 200 and step_calls(calls), proc.stderr
        assert f"batch start {attempt + 1} of at most 2" in proc.stdout
    proc, calls = run_script(script, tmp_path, stubs, rc=200)
    assert proc.returncode == REQUEUE_LIMIT_EXIT_CODE and calls == []
    assert "has started 2 times for this submission and preemption.max_requeues is 1" in proc.stderr
    proc, calls = run_script(script, tmp_path, stubs, {"SLURM_JOB_ID": "4243"})  # resubmitted: its own count
    assert proc.returncode == 0 and step_calls(calls)
    counts = tmp_path / "checkpoints" / "resnet50-ddp" / "attempts"
    assert len((counts / "4242" / "batch").read_text().splitlines()) == 2
    assert not (counts / "4243" / "batch").exists()  # a success closes its count: no start reads it
    assert len((counts / "4243" / "batch.done").read_text().splitlines()) == 1  # status still counts it


def test_preempted_marker_maps_to_requeue(tmp_path) -> None:
    """torchrun hides the child's exit code: the marker written during this attempt decides."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    srun = stubs / "srun"
    srun.write_text(
        '#!/bin/sh\nsleep 0.05\nmkdir -p "$DIST_JOBS_CHECKPOINT_DIR/$DIST_JOBS_RUN"\n'
        'echo 7 > "$DIST_JOBS_CHECKPOINT_DIR/$DIST_JOBS_RUN/PREEMPTED"\nexit 1\n'
    )
    spec = load_spec(data={**SEED, "launcher": "torchrun"})
    proc, calls = run_script(render(spec, "slurm"), tmp_path, stubs)
    assert proc.returncode == 200, proc.stdout + proc.stderr
    assert [c["argv"] for c in calls if c["prog"] == "scontrol"] == [["requeue", "4242"]]


@pytest.mark.parametrize(
    "example",
    sorted(str(p.relative_to(REPO / "slurm" / "examples")) for p in (REPO / "slurm" / "examples").rglob("*.sbatch")),
)
def test_checked_in_examples_pass_shellcheck(example: str) -> None:
    path = REPO / "slurm" / "examples" / example
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    proc = subprocess.run(
        [require_tool("shellcheck"), "-s", "bash", "-S", "warning", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


def test_home_in_folders_is_the_submitters_for_the_job_its_record_and_status(tmp_path, monkeypatch) -> None:
    """`checkpoint_dir: ~/ck` once made the script write `$PWD/~/ck` (the export quoted `~`) while
    job.json, status, Job.progress() and Job.result() read `$HOME/ck`. `~` is the submitting host's
    home everywhere now, also where the job runs with another $HOME."""
    submitter, node_home, cwd = tmp_path / "submitter", tmp_path / "node-home", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(submitter))
    spec = load_spec(data={**SEED, "checkpoint_dir": "~/ck", "log_dir": "~/logs"})

    def sbatch(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, "4242\n", "")

    backend = SlurmBackend(runner=sbatch, cwd=cwd, cluster="c", missing_packages=lambda names: [])
    prepared = backend.prepare(spec)
    assert str(backend.schedule(prepared)) == "slurm://c/4242"
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    proc, calls = run_script(prepared.payload, cwd, stubs, {"HOME": str(node_home)})
    assert proc.returncode == 0, proc.stderr
    (srun,) = step_calls(calls)
    run_dir = submitter / "ck" / "resnet50-ddp"
    assert srun["env"]["DIST_JOBS_CHECKPOINT_DIR"] == str(submitter / "ck")  # what the trainer writes under
    assert srun["env"]["DIST_JOBS_LOG_DIR"] == str(submitter / "logs")
    assert f"--output={submitter / 'logs'}/%x-%j.out" in directives(prepared.payload)
    assert run_dir.is_dir() and (run_dir / "attempts").is_dir()  # the script's own writes land there too
    assert not (cwd / "~").exists() and not (node_home / "ck").exists()
    record = next((cwd / "dist-jobs-runs").glob("*-4242/job.json"))
    assert Path(json.loads(record.read_text())["run_dir"]) == run_dir  # job.json
    assert backend.run_dir("4242") == run_dir  # where status, Job.progress() and Job.result() look


def test_home_of_another_user_is_that_users_and_an_unknown_one_is_refused(monkeypatch) -> None:
    me = pwd.getpwuid(os.getuid())
    monkeypatch.setenv("HOME", "/elsewhere")
    script = render(load_spec(data={**SEED, "checkpoint_dir": f"~{me.pw_name}/ck", "workdir": "~/w"}), "slurm")
    assert f"export DIST_JOBS_CHECKPOINT_DIR={me.pw_dir}/ck" in script.splitlines()
    assert "--chdir=/elsewhere/w" in directives(script)
    with pytest.raises(SpecError) as err:
        load_spec(data={**SEED, "log_dir": "~no-such-user-dj/logs"})
    (problem,) = err.value.problems
    assert problem.field == "log_dir" and "no user 'no-such-user-dj'" in problem.render()
