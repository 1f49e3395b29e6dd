"""dist-jobs on the real SLURM cluster of slurm/cluster/up.sh (nodes n1, n2 and, under make test, n3 with 4 CPUs each).

Every job is small: the tiny conv net of support/workloads.py on the fake images (16 px, 128 images,
batch 4 per rank: 8 steps an epoch, 24 in all), deterministic, gloo on CPU, 2 nodes x 2 ranks,
one CPU per rank. Jobs run as root on this machine's filesystem, so they find this Python
through a `setup` line (PATH) and the repo and tests/ through PYTHONPATH in the spec's `env`.

What is checked: rank identity and placement in srun and torchrun mode; training to the end in
both; `sbatch --test-only` of the checked-in examples; preemption by an external
`scontrol requeue` (srun mode) and by the time-limit warning signal (torchrun mode), each
resuming from its latest checkpoint and ending bit-identical to an uninterrupted run; cancel;
the error for an unknown partition; a submitit job. The suite's SLURM tests run one after
another; a test whose two jobs mostly wait on SLURM's timers (a time limit, a requeue's hold) runs
them side by side (`support.waiting.side_by_side`), which `make test`'s 4-CPU nodes have room for.

Without a cluster answering `sinfo` with two usable nodes the file is skipped, except under CI,
where slurm/cluster/up.sh runs before pytest and a silent cluster is a failure (support.tiers).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dist_jobs.backends.slurm.sbatch import parse_sbatch_test_only, sbatch_error
from dist_jobs.render import render
from dist_jobs.spec.load import load_spec
from support.paths import REPO, TESTS
from support.slurm_jobs import (
    SLOW_FIRST_ATTEMPT,
    TOTAL_STEPS,
    TRAIN,
    backend,
    batch_log,
    cli,
    committed_steps,
    final_sacct_state,
    logs,
    resumed_step,
    spec_data,
    submit,
    wait_finished,
    wait_for,
    write_spec,
)
from support.tiers import require_module, requires
from support.waiting import HUNG_S, eventually, side_by_side

pytestmark = [requires("slurm"), pytest.mark.slow, pytest.mark.timeout(360)]

IDENT = """\
import json, socket
from dist_jobs.ranks import resolve
info = resolve()
print(json.dumps({"rank": info.rank, "local_rank": info.local_rank, "node": info.node_rank,
                  "world": info.world_size, "source": info.source, "host": socket.gethostname(),
                  "master": info.master_addr}), flush=True)
"""


# --- results -------------------------------------------------------------------------------------


def final_model(checkpoints: Path, run: str) -> dict[str, Any]:
    import torch

    path = checkpoints / run / f"step-{TOTAL_STEPS}" / "shared.pt"
    assert path.exists(), f"no final checkpoint {path}; found {sorted(p.name for p in path.parent.parent.glob('*'))}"
    return torch.load(path, weights_only=True)["model"]


def assert_bit_identical(got: dict[str, Any], want: dict[str, Any]) -> None:
    import torch

    assert got.keys() == want.keys()
    different = [name for name in want if not torch.equal(got[name], want[name])]
    assert not different, f"tensors differ from the uninterrupted run: {different}"


def unprefixed(line: str) -> str:
    """A log line without the `[rank N] ` torchrun puts before each worker line (torchrun mode)."""
    return re.sub(r"^\[rank \d+\] ", "", line)


def check_identity(root: Path, job_id: str, source: str, per_rank_file: bool) -> None:
    """Ranks 0,1 on n1 and 2,3 on n2, each with its local rank and node, all dialing n1."""
    for rank in range(4):
        text = logs(root, job_id, rank)
        lines = [unprefixed(line) for line in text.splitlines()]
        # raw_decode: torchrun's prefix for a worker's next write can land on the same line as
        # the record before it ('{...}[rank 3] '), as seen once in CI; the record is whole
        records = [json.JSONDecoder().raw_decode(line)[0] for line in lines if line.startswith("{")]
        if per_rank_file:
            assert len(records) == 1, text
        mine = [r for r in records if r["rank"] == rank]
        assert mine == [
            {
                "rank": rank,
                "local_rank": rank % 2,
                "node": rank // 2,
                "world": 4,
                "source": source,
                "host": f"n{rank // 2 + 1}",
                "master": "n1",
            }
        ], text


# --- the uninterrupted reference run (srun mode) -----------------------------------------------


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The 2 x 2 training in srun mode, submitted with `dist-jobs submit`, run to the end: the
    uninterrupted run every requeue test here ends bit-identical to, trained once per module."""
    root = tmp_path_factory.mktemp("reference")
    job_id = submit(root, write_spec(root, spec_data(root, "reference")))
    try:
        status = wait_finished(root, "reference", job_id)
        yield {
            "root": root,
            "job_id": job_id,
            "status": status,
            "model": final_model(root / "checkpoints", "reference"),
        }
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)


# --- launch modes ------------------------------------------------------------------------------


def test_srun_mode_ranks_hosts_and_training(tmp_path: Path, cleanup: list[str], reference: dict[str, Any]) -> None:
    (tmp_path / "ident.py").write_text(IDENT)
    spec = write_spec(tmp_path, spec_data(tmp_path, "ident-srun"))
    job_id = submit(tmp_path, spec, "python3", str(tmp_path / "ident.py"))
    cleanup.append(job_id)
    assert wait_finished(tmp_path, "ident-srun", job_id).state == "COMPLETED", batch_log(tmp_path, "ident-srun", job_id)
    check_identity(tmp_path, job_id, "slurm", per_rank_file=True)

    root, train_id = reference["root"], reference["job_id"]
    assert reference["status"].state == "COMPLETED", batch_log(root, "reference", train_id)
    rank0 = logs(root, train_id, 0)
    assert f"step {TOTAL_STEPS}/{TOTAL_STEPS} epoch 2" in rank0 and "resumed from" not in rank0
    for rank in range(1, 4):  # every rank's own file, banner first
        assert logs(root, train_id, rank).startswith(f"==> reference-{train_id}-attempt0-rank{rank}.out <==")
    proc = cli(root, "status", "--backend", "slurm", "--json", train_id)
    got = json.loads(proc.stdout) if proc.returncode == 0 else {}
    assert (got.get("state"), got.get("word")) == ("succeeded", "COMPLETED"), proc.stdout + proc.stderr


def test_torchrun_mode_ranks_hosts_and_training(tmp_path: Path, cleanup: list[str], reference: dict[str, Any]) -> None:
    """One SLURM task per node runs torchrun (c10d rendezvous on n1); the node's file holds both
    of its ranks. The training ends bit-identical to srun mode's: same ranks on the same nodes.
    Slow by nature: two 2-node SLURM jobs (the identity probe and the training), torchrun starting the ranks
    on each node; both submitted at once (the cluster's nodes have room for both)."""
    (tmp_path / "ident.py").write_text(IDENT)
    spec = write_spec(tmp_path, spec_data(tmp_path, "ident-torchrun", launcher="torchrun"))
    job_id = submit(tmp_path, spec, "python3", str(tmp_path / "ident.py"))
    cleanup.append(job_id)
    spec = write_spec(tmp_path, spec_data(tmp_path, "train-torchrun", launcher="torchrun"))
    train_id = submit(tmp_path, spec)
    cleanup.append(train_id)
    assert wait_finished(tmp_path, "ident-torchrun", job_id).state == "COMPLETED", batch_log(
        tmp_path, "ident-torchrun", job_id
    )
    check_identity(tmp_path, job_id, "torchrun", per_rank_file=False)

    status = wait_finished(tmp_path, "train-torchrun", train_id)
    assert status.state == "COMPLETED", batch_log(tmp_path, "train-torchrun", train_id)
    assert f"step {TOTAL_STEPS}/{TOTAL_STEPS} epoch 2" in logs(tmp_path, train_id, 0)
    assert_bit_identical(final_model(tmp_path / "checkpoints", "train-torchrun"), reference["model"])


# --- sbatch --test-only of the checked-in examples -----------------------------------------------

# What this 2-node, 2-CPU, GPU-less cluster cannot give. Everything else in the examples stays as
# checked in (time, exclusive, mail, container, NCCL, setup, command, train section, ...).
FIT_THIS_CLUSTER = {
    "gpus_per_node": 0,
    "procs_per_node": 2,
    "cpus_per_task": 1,
    "memory": "1000M",
    "slurm.partition": None,
    "slurm.account": None,
    "slurm.qos": None,
    "slurm.constraint": None,
}


@pytest.mark.parametrize("example", sorted((REPO / "slurm" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_examples_pass_sbatch_test_only(example: Path, tmp_path: Path) -> None:
    """Each example spec, rendered with FIT_THIS_CLUSTER's fields replaced (partition `gpu`,
    GPUs, 8 CPUs per task, 200-256G, account, QOS and constraint do not exist here) but otherwise
    unchanged, is accepted by `sbatch --test-only`. The checked-in script itself, as is, is either
    accepted or refused only for one of those cluster mismatches."""
    checked_in = example.with_suffix(".sbatch")
    assert render(load_spec(example), "slurm") == checked_in.read_text(), "stale example: run make examples"
    script = tmp_path / checked_in.name
    script.write_text(render(load_spec(example, FIT_THIS_CLUSTER), "slurm"))
    (tmp_path / "logs").mkdir()
    proc = subprocess.run(
        ["sbatch", "--test-only", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=HUNG_S
    )
    assert proc.returncode == 0, proc.stderr
    estimate = parse_sbatch_test_only(proc.stderr)
    assert estimate.partition == "debug" and estimate.nodelist == "n[1-2]"

    proc = subprocess.run(
        ["sbatch", "--test-only", str(checked_in)], cwd=tmp_path, capture_output=True, text=True, timeout=HUNG_S
    )
    if proc.returncode != 0:
        message = str(sbatch_error(proc.stderr, proc.returncode))
        assert re.search(
            r"no partition 'gpu'|no nodes matching|CPUs/tasks|account|QOS|rejected the job: "
            r"(Memory|CPU count)|feature|GPU request",
            message,
        ), message


# --- preemption ------------------------------------------------------------------------------------


def submit_api(root: Path, data: dict[str, Any], cleanup: list[str], slow_first: str | None = None) -> str:
    """Submit `data` through the Python backend (prepare, then submit); the job is cancelled after
    the test. `slow_first`: seconds every training forward of the first attempt sleeps."""
    if slow_first is not None:
        data["setup"].append(SLOW_FIRST_ATTEMPT % slow_first)
    slurm = backend(root)
    job_id = slurm.schedule(slurm.prepare(load_spec(data=data))).job_id
    cleanup.append(job_id)
    return job_id


def assert_second_attempt(root: Path, name: str, job_id: str, tasks: int) -> None:
    """SLURM_RESTART_COUNT went to 1: the batch script says so and named attempt 1's files by it
    (one per SLURM task: per rank in srun mode, per node in torchrun mode)."""
    # two of the cluster's nodes (make test's cluster has 3): whichever SLURM picks
    assert re.search(rf"job {job_id} attempt 1 on n\[\d[-,]\d\],", batch_log(root, name, job_id))
    files = sorted(p.name for p in (root / "logs").glob(f"{name}-{job_id}-attempt*-rank*.out"))
    assert files == [f"{name}-{job_id}-attempt{a}-rank{t}.out" for a in (0, 1) for t in range(tasks)]


def test_a_job_requeued_or_signalled_from_outside_checkpoints_and_resumes_bit_identical(
    tmp_path: Path, cleanup: list[str], reference: dict[str, Any]
) -> None:
    """Two jobs side by side (the cluster's nodes have room for both): one requeued with `scontrol
    requeue` (`requeued_from_outside`), one sent `scancel --signal=TERM` (`signalled_from_outside`).
    Slow by nature: each job runs twice: attempt 0 is slowed to 1 s a step so the requeue or signal lands
    mid-training after step 6, and the requeued attempt waits out the cluster's credential hold before it may
    start again and train to the end."""
    side_by_side(
        lambda: requeued_from_outside(tmp_path / "requeue", cleanup, reference),
        lambda: signalled_from_outside(tmp_path / "scancel", cleanup, reference),
    )


def requeued_from_outside(root: Path, cleanup: list[str], reference: dict[str, Any]) -> None:
    """`scontrol requeue` of the running srun-mode job (as a preempting scheduler does): slurmd
    sends the ranks SIGTERM (SIGKILL only after KillWait, 30 s), they checkpoint at the next step
    and exit; SLURM requeues (the script must not requeue again), and attempt 1 resumes from the
    newest committed checkpoint, which is that preemption checkpoint."""
    root.mkdir()
    name = "requeue"
    job_id = submit_api(root, spec_data(root, name), cleanup, slow_first="1.0")
    slurm = backend(root)
    log0 = root / "logs" / f"{name}-{job_id}-attempt0-rank0.out"
    wait_for("step 6", lambda: log0.exists() and "step 6/24" in log0.read_text(), 120, job_id, root, name)
    proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # Once PENDING, attempt 0's processes are gone: the newest checkpoint now is what must resume.
    pending = wait_for(
        "PENDING after the requeue", lambda: slurm.status(job_id).state == "PENDING", 60, job_id, root, name
    )
    assert pending
    latest = committed_steps(root / "checkpoints" / name)[-1]
    assert 4 <= latest < TOTAL_STEPS

    status = wait_finished(root, name, job_id)
    assert status.state == "COMPLETED", batch_log(root, name, job_id)
    assert resumed_step(root, name, job_id) == latest
    first = (root / "logs" / f"{name}-{job_id}-attempt0-rank0.out").read_text(errors="replace")
    assert f"preempted by SIGTERM at step {latest}: checkpoint step-{latest} " in first, first[-3000:]
    batch = batch_log(root, name, job_id)
    assert "terminated by SLURM (scancel or external requeue); not requeueing from here" in batch, batch
    assert_second_attempt(root, name, job_id, tasks=4)
    assert final_sacct_state(job_id) == ("COMPLETED", 2)
    stitched = logs(root, job_id, 0)
    assert stitched.index("-attempt0-rank0.out <==") < stitched.index("-attempt1-rank0.out <==")
    assert_bit_identical(final_model(root / "checkpoints", name), reference["model"])


def test_time_limit_signal_checkpoints_requeues_and_resumes_bit_identical_in_srun_and_torchrun_mode(
    tmp_path: Path, cleanup: list[str], reference: dict[str, Any]
) -> None:
    """Two jobs side by side, one per launch mode (the cluster's nodes have room for both), each
    warned by its time limit (`warned_by_the_time_limit`). The torchrun job is submitted once the
    srun job trains: eight ranks starting torch at once on the loaded 2-core machine once took
    longer than SLURM waited to warn them.
    Slow by nature: the warning can only come from SLURM's own time-limit check (`time: 2`, `grace_seconds:
    30`), which fires 60-90 s after the start, so attempt 0 must still be training then; the requeued attempt
    waits out the credential hold (cred_expire, 5 s) and trains the rest, starting torch in every rank again."""
    first_trains = threading.Event()
    side_by_side(
        lambda: warned_by_the_time_limit("srun", "SIGUSR1", tmp_path / "srun", cleanup, reference, trains=first_trains),
        lambda: warned_by_the_time_limit(
            "torchrun", "SIGTERM", tmp_path / "torchrun", cleanup, reference, after=first_trains
        ),
    )


def warned_by_the_time_limit(
    launcher: str,
    signal: str,
    root: Path,
    cleanup: list[str],
    reference: dict[str, Any],
    trains: threading.Event | None = None,
    after: threading.Event | None = None,
) -> None:
    """`time: 2` minutes, `grace_seconds: 30`: SLURM sends the batch shell USR1 60-90 s after the
    start (it checks every ~30 s, so up to 30 s early): after the ranks' start-up on a busy machine
    (a 60 s grace once let it land 30 s in, and a 45 s grace 45 s in, before the first step; a rank
    still importing torch then dies of the signal, and there is nothing to checkpoint). The script
    passes the step the spec's signal (USR1) in srun mode, SIGTERM in torchrun mode (torchrun hands
    it to its workers); the ranks agree, save a checkpoint, rank 0 leaves the PREEMPTED marker, the
    script requeues, and attempt 1 resumes from that checkpoint. Attempt 0 is slowed to 4 s a step
    (96 s of training) so the warning lands mid-training. `after`: submit once it is set (or after
    4 minutes); `trains`: set once attempt 0 has taken its first step."""
    if after is not None:
        after.wait(timeout=240)
    root.mkdir()
    name = f"warned-{launcher}"
    data = spec_data(root, name, launcher=launcher, time="2", preemption={"grace_seconds": 30})
    job_id = submit_api(root, data, cleanup, slow_first="4.0")
    warned = "dist-jobs: preemption warning, checkpointing"
    if trains is not None:
        log0 = root / "logs" / f"{name}-{job_id}-attempt0-rank0.out"
        stepped = lambda: (log0.exists() and "step 1/24" in log0.read_text()) or warned in batch_log(root, name, job_id)
        wait_for("the first step", stepped, 180, job_id, root, name)
        trains.set()
    wait_for("SLURM's warning", lambda: warned in batch_log(root, name, job_id), 180, job_id, root, name)
    # The warning to attempt 0 is what this test is about. The requeued attempt keeps the job's
    # 2-minute limit, so on a busy machine it could be warned too before it finishes (a third
    # attempt): it gets a limit it cannot reach. (scontrol refuses while the job is between states.)
    raise_limit = ["scontrol", "update", f"JobId={job_id}", "TimeLimit=30"]
    raised = lambda: subprocess.run(raise_limit, capture_output=True).returncode == 0
    wait_for("the requeued attempt's time limit raised", raised, 60, job_id, root, name)
    status = wait_finished(root, name, job_id, timeout=240)
    batch = batch_log(root, name, job_id)
    assert status.state == "COMPLETED", batch
    assert "dist-jobs: preemption warning, checkpointing" in batch
    assert f"dist-jobs: requeueing job {job_id}: requeue 1 of at most 3" in batch
    assert "dist-jobs: step finished with exit code 200" in batch
    first = (root / "logs" / f"{name}-{job_id}-attempt0-rank0.out").read_text(errors="replace")
    preempted = re.search(rf"preempted by {signal} at step (\d+): checkpoint step-\1 .* is committed", first)
    assert preempted, first[-3000:]
    step = int(preempted.group(1))
    assert 0 < step < TOTAL_STEPS
    assert resumed_step(root, name, job_id) == step
    assert_second_attempt(root, name, job_id, tasks=4 if launcher == "srun" else 2)
    assert final_sacct_state(job_id) == ("COMPLETED", 2)
    assert_bit_identical(final_model(root / "checkpoints", name), reference["model"])


def signalled_from_outside(root: Path, cleanup: list[str], reference: dict[str, Any]) -> None:
    """`scancel --signal=TERM` (what an admin or a preempting tool sends the job's steps): the
    ranks checkpoint at the next step boundary and exit 200, the batch script requeues the job,
    and attempt 1 resumes from that checkpoint, ending bit-identical to the uninterrupted run.
    The batch shell of attempt 0 holds the run directory lock (and releases it), attempt 1 takes
    it again, and it is gone once the job has finished."""
    root.mkdir()
    name = "scancel-term"
    job_id = submit_api(root, spec_data(root, name), cleanup, slow_first="1.0")
    log0 = root / "logs" / f"{name}-{job_id}-attempt0-rank0.out"
    wait_for("step 6", lambda: log0.exists() and "step 6/24" in log0.read_text(), 120, job_id, root, name)
    lock = json.loads((root / "checkpoints" / name / "LOCK").read_text())
    assert (lock["backend"], lock["job_id"], lock["owner"], lock["host"]) == ("slurm", job_id, f"slurm:{job_id}", "n1")
    proc = subprocess.run(["scancel", "--signal=TERM", job_id], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    status = wait_finished(root, name, job_id, timeout=240)
    batch = batch_log(root, name, job_id)
    assert status.state == "COMPLETED", batch
    first = log0.read_text(errors="replace")
    stopped = re.search(r"preempted by SIGTERM at step (\d+): checkpoint step-\1 .* is committed", first)
    assert stopped, first[-3000:]
    step = int(stopped.group(1))
    assert 6 <= step < TOTAL_STEPS
    assert f"dist-jobs: requeueing job {job_id}: requeue 1 of at most 3" in batch, batch
    assert "dist-jobs: attempt 0 ended: preempted: checkpointed on a signal" in batch, batch
    assert resumed_step(root, name, job_id) == step
    assert final_sacct_state(job_id) == ("COMPLETED", 2)
    assert not (root / "checkpoints" / name / "LOCK").exists()
    assert_bit_identical(final_model(root / "checkpoints", name), reference["model"])


def test_a_rank_that_stops_stepping_is_dumped_restarted_in_place_and_resumes(
    tmp_path: Path, cleanup: list[str]
) -> None:
    """Rank 1 of 4 stops stepping at its 7th batch, on the first attempt only (the injected
    hang of support/hang_support.py); ranks 0, 2 and 3 wait for it in the gradient all_reduce.
    Every rank's hang watchdog (floor 5 s) writes all its threads' stacks into its log, leaves
    the PREEMPTED marker and exits 200; the verdict is a hang naming rank 1 and, both nodes
    answering, the batch script restarts the step in the same allocation (never requeued): it
    resumes from the last committed checkpoint (step 4) and finishes.
    Slow by nature: the ranks must sit stalled until the watchdog's limit runs out (its 5 s floor, or 10
    times the recent step time if longer) and dump their stacks; then the step starts again and runs
    to the end."""
    name = "hang"
    train = {**TRAIN, "model": "support.hang_support:stalling_net", "hang_min_seconds": 5, "hang_factor": 10}
    data = spec_data(tmp_path, name, train)
    data["env"].update({"DJ_TEST_HANG_MARKER": str(tmp_path / "stalled"), "DJ_TEST_HANG_STEP": "7"})
    job_id = submit_api(tmp_path, data, cleanup)
    status = wait_finished(tmp_path, name, job_id, timeout=240)
    batch = batch_log(tmp_path, name, job_id)
    assert status.state == "COMPLETED", batch
    assert "dist-jobs: restarting in place: restart 1 of at most 3" in batch, batch
    assert re.search(r"attempt 0 ended: hang: rank 1 on \S+ stopped at step 6; the others wait in", batch), batch
    assert "requeueing" not in batch and "dist-jobs: step finished with exit code 0" in batch
    first = {
        r: (tmp_path / "logs" / f"{name}-{job_id}-attempt0-rank{r}.out").read_text(errors="replace") for r in range(4)
    }
    assert "hang_support: rank 1 stops stepping at batch 7" in first[1]
    for rank, text in first.items():
        assert f"rank {rank}: hang watchdog: no optimizer step completed for" in text, text[-3000:]
        assert "Current thread 0x" in text and "(most recent call first)" in text, text[-3000:]
    assert "in stop_stepping" in first[1], first[1][-3000:]
    # Every rank fired, and each names rank 1, the one that stopped, not itself: rank 1 is in its
    # own code (the injected sleep) while the others wait in the gradient all_reduce.
    for rank, text in first.items():
        said = r"hang watchdog: hang: rank 1 on \S+ stopped at step 6; the others wait in (backward|all_reduce)"
        assert re.search(rf"rank {rank}: {said}", text), text[-3000:]
    assert resumed_step(tmp_path, name, job_id) == 4
    assert final_sacct_state(job_id) == ("COMPLETED", 1)  # one allocation
    stitched = logs(tmp_path, job_id, 1)
    assert "hang watchdog" in stitched and stitched.index("-attempt0-rank1.out <==") < stitched.index("-attempt0.1-")
    shown = cli(tmp_path, "status", "--backend", "slurm", job_id)
    assert shown.returncode == 0, shown.stderr
    assert f"  progress: step {TOTAL_STEPS}/{TOTAL_STEPS} (100%) epoch 2  " in shown.stdout, shown.stdout
    assert f"checkpoint {TOTAL_STEPS}  attempt 0  finished" in shown.stdout, shown.stdout
    assert "restarts_in_place: 1" in shown.stdout, shown.stdout


def test_a_second_submission_of_a_running_job_is_refused(tmp_path: Path, cleanup: list[str]) -> None:
    """The same spec submitted twice: the second job's batch script finds the first one's lock
    and ends with exit code 2 before starting a step, naming the holder and the fix; the first
    runs on. Both are 1 task, so they run side by side on the two nodes."""
    name = "twice"
    spec = write_spec(tmp_path, spec_data(tmp_path, name, nodes=1, procs_per_node=1))
    first = submit(tmp_path, spec, "sleep", "300")
    cleanup.append(first)
    run_dir = tmp_path / "checkpoints" / name
    wait_for("the lock", lambda: (run_dir / "LOCK").exists(), 60, first, tmp_path, name)
    second = submit(tmp_path, spec, "sleep", "300")
    cleanup.append(second)
    status = wait_finished(tmp_path, name, second, timeout=120)
    batch = batch_log(tmp_path, name, second)
    print(batch)
    assert status.state == "FAILED" and final_sacct_state(second)[0] == "FAILED", batch
    assert f"dist-jobs: run directory {run_dir} is in use by another run (slurm job {first}, pid " in batch
    assert f"hint: wait for that run to end or stop it (scancel {first})" in batch
    assert not list((tmp_path / "logs").glob(f"{name}-{second}-attempt*-rank*.out")), "a step started"
    assert backend(tmp_path).status(first).state == "RUNNING"
    assert json.loads((run_dir / "LOCK").read_text())["job_id"] == first
    proc = subprocess.run(
        ["sacct", "--noheader", "--parsable2", "--jobs", second, "--format", "ExitCode", "-X"],
        capture_output=True,
        text=True,
    )
    assert proc.stdout.strip() == "2:0", proc.stdout


# --- cancel, errors, submitit ---------------------------------------------------------------------


def test_cancel_ends_the_job_cancelled(tmp_path: Path, cleanup: list[str]) -> None:
    spec = write_spec(tmp_path, spec_data(tmp_path, "to-cancel", nodes=1, procs_per_node=1))
    job_id = submit(tmp_path, spec, "sleep", "300")
    cleanup.append(job_id)
    slurm = backend(tmp_path)
    wait_for("RUNNING", lambda: slurm.status(job_id).state == "RUNNING", 60, job_id, tmp_path, "to-cancel")
    assert any(s.job_id == job_id for s in slurm.list())
    proc = cli(tmp_path, "cancel", "--backend", "slurm", job_id)
    said = rf"(cancelled slurm://[^/]+/{job_id}|stopping slurm://[^/]+/{job_id} \(cancelled; .*\))\n"  # COMPLETING
    assert proc.returncode == 0 and re.fullmatch(said, proc.stdout), proc.stdout + proc.stderr
    assert wait_finished(tmp_path, "to-cancel", job_id, timeout=60).state == "CANCELLED"


def test_unknown_partition_is_a_clear_error(tmp_path: Path) -> None:
    proc = cli(
        tmp_path,
        "submit",
        "--backend",
        "slurm",
        "--name",
        "nowhere",
        "--nodes",
        "1",
        "--procs-per-node",
        "1",
        "--partition",
        "nosuch",
        "--",
        "true",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "SLURM has no partition 'nosuch'" in proc.stderr and "sinfo" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists(), "a failed submit left a job directory"


def submitit_logs(folder: Path) -> str:
    """The tail of every task's stdout and stderr in a submitit job's folder."""
    found = sorted(folder.glob("*_log.*"))
    return "\n".join(f"--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in found)


def wait_submitit(job: Any, folder: Path, what: str, ready: Any, timeout: float) -> None:
    """Poll `ready()` until it is truthy; on timeout fail with the job's state and its logs."""
    eventually(
        ready,
        timeout=timeout,
        interval=1.0,
        what=f"{what} of submitit job {job.job_id}",
        context=lambda: f"state {job.get_info().get('State')}\n{submitit_logs(folder)}",
    )


def test_submitit_job_from_a_spec_returns_the_metrics(tmp_path: Path) -> None:
    require_module("submitit")
    from dist_jobs.backends.submitit_executor import make_executor
    from dist_jobs.train.task import TrainTask

    spec = load_spec(data=spec_data(tmp_path, "submitit", train={**TRAIN, "epochs": 1}))
    executor = make_executor(spec, tmp_path / "submitit" / "%j", cluster="slurm")
    job = executor.submit(TrainTask(spec))
    try:
        wait_submitit(job, tmp_path / "submitit" / job.job_id, "end", job.done, 150)
        # 4 tasks: submitit refuses job.result() for a job with tasks; each task has its own.
        metrics = job.task(0).result()
        every_rank = job.results()
    finally:
        job.cancel(check=False)
    assert metrics["step"] == 8.0 and metrics["epoch"] == 0.0, metrics
    assert {"train_loss", "eval_loss", "eval_accuracy"} <= metrics.keys()
    assert every_rank == [metrics] * 4
    assert (tmp_path / "checkpoints" / "submitit" / "step-8" / "COMPLETE").exists()


def test_submitit_job_preempted_by_its_signal_requeues_and_resumes_bit_identical(
    tmp_path: Path, reference: dict[str, Any]
) -> None:
    """submitit's warning signal (SIGUSR2, which SLURM sends `grace_seconds` before the time
    limit; here sent with `scancel --signal`) reaches every task: the ranks agree, checkpoint and
    leave fit(); rank 0 hands the signal to submitit, which requeues the job, and the requeued
    job resumes from that checkpoint and ends on the uninterrupted run's bits. The other ranks
    leave without recording a result: an error there would read as a failed task.
    Slow by nature: the job runs twice (attempt 0 slowed to 1 s a step so the signal lands mid-training, then
    the requeued attempt, which waits out the cluster's 10 s credential hold), and every rank starts torch and
    unpickles submitit's task in each."""
    require_module("submitit")
    from dist_jobs.backends.submitit_executor import make_executor
    from dist_jobs.train.task import TrainTask

    name = "submitit-preempted"
    data = spec_data(tmp_path, name)
    data["setup"].append(SLOW_FIRST_ATTEMPT % "1.0")
    spec = load_spec(data=data)
    job = make_executor(spec, tmp_path / "submitit" / "%j", cluster="slurm").submit(TrainTask(spec))
    folder = tmp_path / "submitit" / job.job_id
    checkpoints = tmp_path / "checkpoints" / name
    try:
        wait_submitit(job, folder, "checkpoint step-4", lambda: 4 in committed_steps(checkpoints), 120)
        proc = subprocess.run(["scancel", "--signal=USR2", job.job_id], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        wait_submitit(job, folder, "end", job.done, 240)
        every_rank = job.results()
    except BaseException:
        job.cancel(check=False)  # only then: the job is to end COMPLETED on its own
        raise
    assert [r["step"] for r in every_rank] == [float(TOTAL_STEPS)] * 4, every_rank
    told = {t: "".join(p.read_text(errors="replace") for p in sorted(folder.glob(f"*_{t}_log.*"))) for t in range(4)}
    rank0 = told[0]
    stopped = re.search(r"preempted by SIGUSR2 at step (\d+): checkpoint step-\1 .* is committed", rank0)
    assert stopped, submitit_logs(folder)
    step = int(stopped.group(1))
    assert 4 <= step < TOTAL_STEPS
    assert re.search(rf"resumed from \S+/{name}/step-{step}: .* step {step} overall", rank0), submitit_logs(folder)
    assert f"Requeued job {job.job_id}" in rank0, submitit_logs(folder)
    for task in (1, 2, 3):  # they said why they left, and recorded no error for submitit
        assert f"at step {step}: checkpoint step-{step} in" in told[task], submitit_logs(folder)
        assert "triggered an exception" not in told[task], submitit_logs(folder)
    assert final_sacct_state(job.job_id) == ("COMPLETED", 2)
    assert_bit_identical(final_model(tmp_path / "checkpoints", name), reference["model"])


# --- your own unmodified script: torch's env:// contract in every mode ------------------------

ENV_SCRIPT = TESTS / "support" / "envscript.py"
FABRIC_SCRIPT = """\
import json, socket
import torch
from lightning.fabric import Fabric
fabric = Fabric(accelerator="cpu", strategy="ddp", num_nodes=2, devices=2)
fabric.launch()
total = fabric.all_reduce(torch.tensor([float(fabric.global_rank)]), reduce_op="sum")
print("RESULT " + json.dumps({"rank": fabric.global_rank, "world": fabric.world_size,
      "local_rank": fabric.local_rank, "node": fabric.node_rank, "host": socket.gethostname(),
      "cluster": type(fabric._connector.cluster_environment).__name__, "sum": total.item()}), flush=True)
# Without it gloo's threads can outlive the interpreter and abort the rank at exit (pytorch#190489).
torch.distributed.destroy_process_group()
"""


def results(root: Path, job_id: str) -> list[dict[str, Any]]:
    found = []
    for rank in range(4):
        lines = [unprefixed(line) for line in logs(root, job_id, rank).splitlines()]
        found += [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]
    # In an older torchrun job a rank's log was its node's: each line showed up twice.
    unique = {json.dumps(r, sort_keys=True): r for r in found}
    return sorted(unique.values(), key=lambda r: r["rank"])


def env_spec(root: Path, name: str, **fields: Any) -> Path:
    # No `setup` line putting the venv on PATH: the job's python comes from `dist-jobs submit`.
    data = spec_data(root, name, **fields)
    data["setup"] = []
    data["env"] = {"PYTHONUNBUFFERED": "1"}
    return write_spec(root, data)


def test_unmodified_env_script_gets_torchs_contract_in_srun_and_torchrun_mode(
    tmp_path: Path, cleanup: list[str]
) -> None:
    """One job per launch mode, both submitted at once (the cluster's nodes have room for both).
    Slow by nature: 2-node SLURM jobs whose four ranks each start torch to read its contract."""
    jobs = {}
    for launcher in ("srun", "torchrun"):
        spec = env_spec(tmp_path, f"env-{launcher}", launcher=launcher)
        jobs[launcher] = submit(tmp_path, spec, "python", str(ENV_SCRIPT))
        cleanup.append(jobs[launcher])
    for launcher, job_id in jobs.items():
        name = f"env-{launcher}"
        assert wait_finished(tmp_path, name, job_id).state == "COMPLETED", batch_log(tmp_path, name, job_id)
        assert_env_contract(results(tmp_path, job_id))


def assert_env_contract(got: list[dict[str, Any]]) -> None:
    """Ranks 0-3, two a node on n1 and n2, each with torch's env:// contract as torch reads it."""
    assert [r["rank"] for r in got] == [0, 1, 2, 3], got
    for r in got:
        node = r["rank"] // 2
        assert (r["world"], r["local_rank"], r["host"], r["group_rank"]) == (
            4,
            r["rank"] % 2,
            f"n{node + 1}",
            str(node),
        )
        assert r["node_rank"] == str(node), r  # dist-jobs' launcher runs every process, under torchrun too
        assert (r["master_addr"], r["local_world_size"], r["sum"]) == ("n1", "2", 6.0), r
        assert r["omp_num_threads"] == "1"  # --cpus-per-task=1: one thread, not one per core


def test_lightning_fabric_detects_slurm_itself_in_srun_mode(tmp_path: Path, cleanup: list[str]) -> None:
    """Slow by nature: a 2-node SLURM job whose four ranks each import Lightning (and torch)."""
    require_module("lightning")
    (tmp_path / "fabric_script.py").write_text(FABRIC_SCRIPT)
    job_id = submit(tmp_path, env_spec(tmp_path, "env-fabric"), "python3", str(tmp_path / "fabric_script.py"))
    cleanup.append(job_id)
    assert wait_finished(tmp_path, "env-fabric", job_id).state == "COMPLETED", batch_log(tmp_path, "env-fabric", job_id)
    got = results(tmp_path, job_id)
    assert [(r["rank"], r["local_rank"], r["node"], r["host"]) for r in got] == [
        (0, 0, 0, "n1"),
        (1, 1, 0, "n1"),
        (2, 0, 1, "n2"),
        (3, 1, 1, "n2"),
    ], got
    assert {(r["world"], r["cluster"], r["sum"]) for r in got} == {(4, "SLURMEnvironment", 6.0)}
