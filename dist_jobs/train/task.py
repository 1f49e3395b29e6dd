"""Work for submitit, built from a job spec: the training entrypoint (`TrainTask`) or any function
of yours (`FunctionTask`), with the same ranks, resume and requeue contract.

    job = make_executor(spec, "logs").submit(FunctionTask(spec, my_train, lr=0.1))

On the node each task exports torch's env:// variables and the job environment, then runs. A
function that calls fit() checkpoints on submitit's warning signal (SIGUSR2) as well as the
spec's; fit() then raises Preempted, and the task hands the signal back to submitit, whose
handler calls `checkpoint()` and requeues the job; the requeued task resumes from the latest
checkpoint. A function that does not call fit() is requeued the same way and starts again.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dist_jobs.constants import REQUEUE_EXIT_CODE
from dist_jobs.errors import Preempted
from dist_jobs.ranks.ports import derive_port
from dist_jobs.spec import JobSpec
from dist_jobs.spec.env import job_env
from dist_jobs.spec.paths import checkpoint_root
from dist_jobs.train.logsetup import log_to_stderr
from dist_jobs.train.signals import LAUNCH_SIGNALS_VAR

log = logging.getLogger("dist_jobs.train")

# submitit's default preemption/timeout signal (SUBMITIT_PREEMPT_SIGNAL overrides it).
SUBMITIT_SIGNAL = "SIGUSR2"


class FunctionTask:
    """`fn(*args, **kwargs)` on every task of the job (picklable when fn is: submitit uses cloudpickle)."""

    def __init__(self, spec: JobSpec, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.spec, self.fn, self.args, self.kwargs = spec, fn, args, kwargs

    def _export_env(self) -> None:
        import submitit  # an optional dependency: this runs under submitit, which has it

        env = submitit.JobEnvironment()
        # The job inherits the submitter's environment: a MASTER_ADDR or RANK left there by another
        # launcher would make submitit refuse to export its own (it never overwrites).
        for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(key, None)
        # The spec's port, else the one dist-jobs derives everywhere: submitit's own pick (20000-60000)
        # falls mostly in the kernel's ephemeral range, where srun's listening sockets on the first
        # node can already hold it, and the other ranks then wait on srun instead of the store.
        dist = submitit.helpers.TorchDistributedEnvironment()
        dist.master_port = self.spec.master_port or derive_port(int(env.raw_job_id))
        dist.export(set_cuda_visible_devices=False)
        ckpt = checkpoint_root(self.spec.checkpoint_dir, Path.cwd())  # the job's folder: its view
        os.environ.update(
            {
                # submitit sets the env:// variables itself, as torchrun would for its children.
                "TORCHELASTIC_RUN_ID": f"submitit-{env.job_id}",
                "GROUP_RANK": str(env.node),
                "NODE_RANK": str(env.node),
                "LOCAL_WORLD_SIZE": str(dist.local_world_size),
                LAUNCH_SIGNALS_VAR: SUBMITIT_SIGNAL,
                **job_env(self.spec, "submitit", str(ckpt)),
            }
        )

    def run(self) -> Any:
        return self.fn(*self.args, **self.kwargs)

    def __call__(self) -> Any:
        self._export_env()
        try:
            return self.run()
        except Preempted as stop:
            log.warning("%s", stop)
            # The checkpoint is committed and fit() has put submitit's handler back: hand the
            # signal to it. On rank 0 it calls checkpoint(), requeues the job and exits.
            os.kill(os.getpid(), getattr(signal, SUBMITIT_SIGNAL))
            # On the other ranks it returns. Leave without a result: submitit would record the
            # Preempted error as this task's outcome until the requeued job overwrites it.
            raise SystemExit(REQUEUE_EXIT_CODE) from None

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit  # an optional dependency: this runs under submitit, which has it

        return submitit.helpers.DelayedSubmission(self)


class TrainTask(FunctionTask):
    """The built-in training entrypoint: fit() on the spec's `train` section."""

    def __init__(self, spec: JobSpec) -> None:
        super().__init__(spec, _fit_spec, spec)


def _fit_spec(spec: JobSpec) -> dict[str, float]:
    from dist_jobs.train.loop import fit  # torch: the submitter pickles this function without it

    log_to_stderr(int(os.environ["RANK"]))  # as `python -m dist_jobs.train` does
    return fit(spec.train)
