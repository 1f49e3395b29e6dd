"""The training entrypoint as a submitit checkpointable callable (built by
dist_jobs.backends.submitit_backend.make_executor's caller, run on the compute node).

Preemption: the training loop owns the signal (flag, all ranks agree, checkpoint at the step
boundary), then hands the signal back to submitit, whose handler calls `TrainTask.checkpoint`
and requeues the job; the requeued task resumes from the latest checkpoint.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import msgspec

from dist_jobs.spec import JobSpec
from dist_jobs.spec.env import job_env

# submitit's default preemption/timeout signal (SUBMITIT_PREEMPT_SIGNAL overrides it).
SUBMITIT_SIGNAL = "SIGUSR2"


class TrainTask:
    """The training entrypoint as a submitit checkpointable callable (picklable: spec only)."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec

    def _export_env(self) -> None:
        import submitit

        env = submitit.JobEnvironment()
        # The job inherits the submitter's environment: a MASTER_ADDR or RANK left there by another
        # launcher would make submitit refuse to export its own (it never overwrites).
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(key, None)
        dist = submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        ckpt = Path(self.spec.checkpoint_dir)
        os.environ.update(
            {
                # submitit sets the env:// variables itself, as torchrun would for its children.
                "TORCHELASTIC_RUN_ID": f"submitit-{env.job_id}",
                "GROUP_RANK": str(env.node),
                "LOCAL_WORLD_SIZE": str(dist.local_world_size),
                **job_env(self.spec, "submitit", str(ckpt if ckpt.is_absolute() else Path.cwd() / ckpt)),
            }
        )

    def __call__(self) -> dict[str, Any]:
        from dist_jobs.train.loop import Preempted, fit

        self._export_env()
        signals = tuple(dict.fromkeys((*self.spec.train.preempt_signals, SUBMITIT_SIGNAL)))
        config = msgspec.structs.replace(self.spec.train, preempt_signals=signals)
        try:
            return fit(config)
        except Preempted:
            # The checkpoint is committed and fit() has put submitit's handler back: hand the
            # signal to it, so it calls checkpoint() and requeues the job.
            os.kill(os.getpid(), getattr(signal, SUBMITIT_SIGNAL))
            raise

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(TrainTask(self.spec))
