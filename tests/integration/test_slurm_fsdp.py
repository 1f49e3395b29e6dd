"""`train.strategy: fsdp` on the real 2-node SLURM cluster: a 2 nodes x 2 ranks FSDP2 job (the
built-in GPT, sharded per block) in torchrun mode is requeued from outside (`scontrol requeue`, as
a preempting scheduler does) once a sharded checkpoint is committed; every rank checkpoints its
shards at the next step boundary, and the second attempt resumes from that checkpoint through DCP
and completes.

One launch mode: the sharded save and load do not depend on it (DCP works on the process group,
whoever started the ranks), and each mode's own part of a requeue is proven elsewhere on this
cluster: srun mode's by the pair requeued and signalled from outside, torchrun's agent forwarding
the signal by the time-limit pair (test_slurm_cluster.py). torchrun mode is kept here because it is
the only test of `scontrol requeue` reaching torchrun's workers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support.slurm_jobs import (
    backend,
    batch_log,
    committed_steps,
    final_sacct_state,
    resumed_step,
    spec_data,
    submit,
    wait_finished,
    wait_for,
    write_spec,
)
from support.tiers import requires

pytestmark = [requires("slurm"), pytest.mark.slow, pytest.mark.timeout(420)]

GPT = {
    "model": "support.workloads:slow_gpt",
    "data": "text",
    "seq_len": 16,
    "text_chars": 4000,
    "batch_size": 2,
    "grad_accum": 2,
    "epochs": 1,
    "optimizer": "adamw",
    "lr": 0.01,
    "deterministic": True,
    "seed": 3,
    "device": "cpu",
    "log_every": 1,
    "progress": False,
    "strategy": "fsdp",
    "checkpoint_every_steps": 2,
}


def test_an_fsdp_job_requeued_from_outside_resumes_from_its_sharded_checkpoint(
    tmp_path: Path, cleanup: list[str]
) -> None:
    """Slow by nature: the job runs twice: attempt 0 is slowed to 0.4 s a step so the requeue lands
    after a sharded checkpoint is committed, and the requeued attempt waits out the cluster's 10 s credential
    hold, then sets up FSDP and loads the shards through DCP again."""
    name = "fsdp-torchrun"
    data = spec_data(tmp_path, name, train=GPT, launcher="torchrun")
    data["setup"].append('if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then export DJ_TEST_STEP_DELAY=0.4; fi')
    job = submit(tmp_path, write_spec(tmp_path, data))
    cleanup.append(job)
    run_dir = tmp_path / "checkpoints" / name
    wait_for("checkpoint step-4", lambda: (run_dir / "step-4" / "COMPLETE").exists(), 180, job, tmp_path, name)
    assert (run_dir / "step-4" / ".metadata").is_file()  # DCP's sharded format, not one rank's whole model
    proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    slurm = backend(tmp_path)
    wait_for("PENDING after the requeue", lambda: slurm.status(job).state == "PENDING", 90, job, tmp_path, name)
    latest = committed_steps(run_dir)[-1]
    status = wait_finished(tmp_path, name, job, timeout=240)
    assert status.state == "COMPLETED", batch_log(tmp_path, name, job)
    assert final_sacct_state(job) == ("COMPLETED", 2)
    assert resumed_step(tmp_path, name, job) == latest >= 4
    final = committed_steps(run_dir)[-1]
    assert final > latest and (run_dir / f"step-{final}" / ".metadata").is_file()
