"""The run directory lock in the job scripts: the sbatch script (run with stub srun/scontrol) and
the pod entrypoint (run as the container's `sh -c`) take it before the program starts, hand its
token to the program, refuse a second run with exit 2, let a requeued attempt or a replaced pod of
the same job take it over, and release it at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dist_jobs.render import render
from dist_jobs.rundir.holder import Holder
from dist_jobs.rundir.lock import LOCK_NAME
from dist_jobs.spec.load import load_spec
from support.lock_support import beating, foreign, plant
from support.render_helpers import make_stubs, run_pod_entrypoint, run_script, step_calls
from support.tiers import requires

SLURM = {"name": "locked", "nodes": 2, "procs_per_node": 2}
K8S = {"name": "locked", "nodes": 2, "procs_per_node": 1, "image": "x/y:1", "k8s": {"namespace": "ml"}}


# -- sbatch ------------------------------------------------------------------------------------------


def test_the_batch_script_holds_the_lock_around_the_step(tmp_path: Path) -> None:
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    (stubs / "srun").write_text(
        '#!/bin/sh\ncp "$DIST_JOBS_CHECKPOINT_DIR/$DIST_JOBS_RUN/LOCK" "$STUB_OUT.lock"\n'
        'echo "$DIST_JOBS_LOCK_TOKEN" > "$STUB_OUT.token"\n'
    )
    proc, _ = run_script(render(load_spec(data=SLURM), "slurm"), tmp_path, stubs)
    assert proc.returncode == 0, proc.stderr
    during = json.loads((tmp_path / "stub-calls.jsonl.lock").read_text())
    assert (during["backend"], during["job_id"], during["owner"]) == ("slurm", "4242", "slurm:4242")
    assert during["token"] == (tmp_path / "stub-calls.jsonl.token").read_text().strip()  # the step has it
    assert not (tmp_path / "checkpoints" / "locked" / LOCK_NAME).exists()  # released at the end
    assert "Killed" not in proc.stderr  # the heartbeat's end is silent


def test_a_second_job_is_refused_before_its_step(tmp_path: Path) -> None:
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    holder = foreign("slurm:4100", "slurm", "4100")
    lock = plant(tmp_path / "checkpoints" / "locked", holder)
    with beating(lock, holder):
        proc, calls = run_script(render(load_spec(data=SLURM), "slurm"), tmp_path, stubs)
    assert proc.returncode == 2 and not [c for c in calls if c["prog"] == "srun"]
    assert not (lock.parent / "attempts").exists()  # a refused job is no attempt of the run
    assert "is in use by another run (slurm job 4100, pid 99999 on host elsewhere" in proc.stderr
    assert "stop it (scancel 4100)" in proc.stderr
    assert Holder.parse(lock.read_bytes()) == holder


def test_a_requeued_attempt_takes_its_own_jobs_lock_over(tmp_path: Path) -> None:
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    plant(tmp_path / "checkpoints" / "locked", foreign("slurm:4242", "slurm", "4242"))
    proc, calls = run_script(render(load_spec(data=SLURM), "slurm"), tmp_path, stubs, {"SLURM_RESTART_COUNT": "1"})
    assert proc.returncode == 0 and step_calls(calls), proc.stderr
    assert "took over the lock" in proc.stderr and "same job (slurm:4242)" in proc.stderr


# -- the pod entrypoint ------------------------------------------------------------------------------


def run_pod(tmp_path: Path, program: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The container command of the K8S spec, with `program` (sh code) in place of the trainer."""
    owner = {"DIST_JOBS_LOCK_OWNER": "k8s:pytorchjob/ml/locked"}
    return run_pod_entrypoint(K8S, program, tmp_path / "shared", {**owner, **env})


def test_pod_rank_0_holds_the_lock_for_its_program(tmp_path: Path) -> None:
    show = 'cat "$DIST_JOBS_CHECKPOINT_DIR/$DIST_JOBS_RUN/LOCK"; echo; echo "token=$DIST_JOBS_LOCK_TOKEN"; exit 7'
    proc = run_pod(tmp_path, show, PET_NODE_RANK="0")
    assert proc.returncode == 7, proc.stderr  # the program's code passes through
    record = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
    assert (record["backend"], record["owner"], record["job_id"]) == (
        "k8s",
        "k8s:pytorchjob/ml/locked",
        "pytorchjob/ml/locked",
    )
    assert f"token={record['token']}" in proc.stdout
    assert not (tmp_path / "shared" / "locked" / LOCK_NAME).exists()


def test_a_second_job_on_the_same_volume_is_refused_a_replaced_pod_takes_over(tmp_path: Path) -> None:
    run_dir = tmp_path / "shared" / "locked"
    other = foreign("k8s:pytorchjob/other-ns/locked", "k8s", "pytorchjob/other-ns/locked")
    with beating(plant(run_dir, other), other):
        refused = run_pod(tmp_path, "echo started", PET_NODE_RANK="0")
    assert refused.returncode == 2 and "started" not in refused.stdout
    assert "stop it (kubectl delete pytorchjob locked -n other-ns)" in refused.stderr, refused.stderr

    plant(run_dir, foreign("k8s:pytorchjob/ml/locked", "k8s", "pytorchjob/ml/locked"))  # this job's old pod
    replaced = run_pod(tmp_path, "echo started", PET_NODE_RANK="0")
    assert replaced.returncode == 0 and "started" in replaced.stdout, replaced.stderr
    assert "an earlier attempt of the same job (k8s:pytorchjob/ml/locked)" in replaced.stderr


def test_other_pods_leave_the_lock_to_pod_rank_0(tmp_path: Path) -> None:
    proc = run_pod(tmp_path, 'echo "token=${DIST_JOBS_LOCK_TOKEN:-none}"', PET_NODE_RANK="1")
    assert proc.returncode == 0 and "token=none" in proc.stdout, proc.stderr
    assert not (tmp_path / "shared" / "locked" / LOCK_NAME).exists()


def test_a_pod_without_the_lock_whose_job_lost_the_run_directory_stops_and_writes_nothing(tmp_path: Path) -> None:
    """Only pod rank 0 holds the lock; another pod learns at its program's end that another job
    holds the run directory now: exit 6 (not requeued), and no verdict written there."""
    run_dir = tmp_path / "shared" / "locked"
    plant(run_dir, foreign("k8s:pytorchjob/other/locked", "k8s", "x"))
    proc = run_pod(tmp_path, "exit 1", PET_NODE_RANK="1")
    assert proc.returncode == 6, proc.stderr
    assert "lock lost: another run took the run directory over" in proc.stderr
    assert not (run_dir / "verdicts").exists()


def test_the_pods_heartbeat_keeps_the_lock_fresh(tmp_path: Path) -> None:
    lock = tmp_path / "shared" / "locked" / LOCK_NAME
    # set the lock 100 s back, then wait (up to 60 s) for the heartbeat to touch it again
    old = int(time.time()) - 100
    program = (
        f'touch -d @{old} "{lock}"; '
        f'for _ in $(seq 600); do [ "$(stat -c %Y "{lock}")" -gt {old} ] && break; sleep 0.1; done; '
        f'stat -c %Y "{lock}"'
    )
    proc = run_pod(tmp_path, program, PET_NODE_RANK="0", DIST_JOBS_LOCK_HEARTBEAT_SECONDS="0.2")
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) > old  # touched again by the heartbeat
    assert not lock.exists() and set(os.listdir(lock.parent)) <= {
        "attempts",
        "verdicts",
    }  # the restart cap, how it ended


def test_a_batch_job_that_lost_its_lock_stops_writes_nothing_and_is_not_requeued(tmp_path: Path) -> None:
    """Another run takes the lock over while the step runs (this job was suspended past the stale
    limit): the heartbeat kills the job's steps, and the script exits 6 without counting the
    attempt done, requeueing or releasing the other run's lock."""
    stubs = make_stubs(tmp_path / "bin", sys.executable)
    thief = foreign("slurm:4300", "slurm", "4300")
    run_dir = tmp_path / "checkpoints" / "locked"
    record = thief.to_bytes().decode().strip()
    (stubs / "srun").write_text(
        # the other run's record renamed over LOCK, as a takeover does: never a half-written file
        f'#!/bin/sh\nlock="$DIST_JOBS_CHECKPOINT_DIR/$DIST_JOBS_RUN/LOCK"\n'
        f'printf \'%s\' \'{record}\' > "$lock.new" && mv "$lock.new" "$lock"\n'
        # killed by the heartbeat's scancel (the stub records it); given up after 30 s either way
        f'for _ in $(seq 600); do [ -e "{tmp_path}/scancelled" ] && break; sleep 0.05; done\nexit 137\n'
    )
    (stubs / "squeue").write_text("#!/bin/sh\necho 4242.batch; echo 4242.0\n")
    (stubs / "scancel").write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/scancelled"\n')
    for name in ("squeue", "scancel"):
        (stubs / name).chmod(0o755)
    env = {"DIST_JOBS_LOCK_HEARTBEAT_SECONDS": "0.1"}
    proc, calls = run_script(render(load_spec(data=SLURM), "slurm"), tmp_path, stubs, env)
    assert proc.returncode == 6, proc.stderr
    assert (tmp_path / "scancelled").read_text().split() == ["--signal=KILL", "4242.0"]  # the step, not the batch
    assert "lost the lock of run directory" in proc.stderr and "slurm job 4300" in proc.stderr
    assert "this job lost the run directory lock (its step ended with exit code 137): exit 6" in proc.stdout
    assert not [c for c in calls if c["prog"] == "scontrol" and "requeue" in c["argv"]]
    assert Holder.parse((run_dir / LOCK_NAME).read_bytes()) == thief  # the other run's lock stays
    assert (run_dir / "attempts" / "4242" / "batch").is_file()  # counted, never marked done


@requires("torch")
def test_a_pod_that_lost_its_lock_kills_its_program_and_exits_6(tmp_path: Path) -> None:
    thief = foreign("k8s:pytorchjob/other/locked", "k8s", "pytorchjob/other/locked")
    lock = tmp_path / "shared" / "locked" / LOCK_NAME
    program = (
        f"printf '%s' '{thief.to_bytes().decode().strip()}' > '{lock}'; "
        f"sh -c 'sleep 30; touch {tmp_path}/survived' & wait"
    )
    started = time.monotonic()
    proc = run_pod(tmp_path, program, PET_NODE_RANK="0", DIST_JOBS_LOCK_HEARTBEAT_SECONDS="0.1")
    assert proc.returncode == 6, proc.stderr
    assert time.monotonic() - started < 20 and not (tmp_path / "survived").exists()  # the tree was killed
    assert "this job lost the run directory lock: exit 6" in proc.stderr
    assert Holder.parse(lock.read_bytes()) == thief


def test_a_worker_pods_program_is_stopped_once_another_job_takes_the_run_directory_over(tmp_path: Path) -> None:
    """Pod 1 holds no lock but its program writes into the run directory (a user's script saving
    its shards): it follows pod 0's lock, and once another job holds it the program is killed
    at once (no line after the takeover) and the pod exits 6, not retried."""
    run_dir = tmp_path / "shared" / "locked"
    ours = plant(run_dir, foreign("k8s:pytorchjob/ml/locked", "k8s", "pytorchjob/ml/locked"))  # pod 0's
    thief = foreign("k8s:pytorchjob/other/locked", "k8s", "pytorchjob/other/locked")
    took_over = tmp_path / "took-over"
    program = (
        # a line into the run directory every 0.05 s; a second in, another job takes LOCK over
        f'for i in $(seq 400); do echo "$i" >> "{run_dir}/writes"; sleep 0.05; '
        # (the step is noted before the move: the follower may kill the program right after it)
        f'[ "$i" = 20 ] && printf %s \'{thief.to_bytes().decode().strip()}\' > "{ours}.new" '
        f'&& echo "$i" > "{took_over}" && mv "{ours}.new" "{ours}"; done'
    )
    proc = run_pod(tmp_path, program, PET_NODE_RANK="1", DIST_JOBS_LOCK_HEARTBEAT_SECONDS="0.1")
    assert proc.returncode == 6, proc.stderr
    assert "lost the lock of run directory" in proc.stderr and "pytorchjob/other/locked" in proc.stderr
    written = (run_dir / "writes").read_text().split()
    assert took_over.read_text().strip() == "20" and len(written) < 40, written  # stopped within a few beats
    assert Holder.parse(ours.read_bytes()) == thief  # the other job's lock stays


def test_a_worker_pod_whose_job_keeps_the_lock_runs_its_program_to_the_end(tmp_path: Path) -> None:
    """Another job's stale lock while pod 0 waits it out is not a loss: pod 0 then takes it over."""
    run_dir = tmp_path / "shared" / "locked"
    stale = plant(run_dir, foreign("k8s:pytorchjob/other/locked", "k8s", "pytorchjob/other/locked"))
    ours = foreign("k8s:pytorchjob/ml/locked", "k8s", "pytorchjob/ml/locked").to_bytes().decode().strip()
    program = f'sleep 0.5; printf %s \'{ours}\' > "{stale}.new" && mv "{stale}.new" "{stale}"; sleep 1; echo done'
    proc = run_pod(tmp_path, program, PET_NODE_RANK="1", DIST_JOBS_LOCK_HEARTBEAT_SECONDS="0.1")
    assert proc.returncode == 0 and "done" in proc.stdout, proc.stderr
    assert "lost the lock" not in proc.stderr
