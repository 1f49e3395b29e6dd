"""`python3 -m dist_jobs.train.torchrun [torchrun's flags] CMD ...`: torchrun, exiting as its first
failed worker did.

torchrun exits 1 whatever ended its workers, so a rank SIGKILLed by the node (a fault: restart it)
and a rank's own error (a bug: fail at once) look alike to whoever reads its exit code: the batch
script on SLURM, the pod entrypoint on Kubernetes, the local launcher. Here torchrun runs as
itself (same flags, same PET_* variables, same workers and teardown) and, when a worker failed,
exits with that worker's code, 128+N for signal N, the one a shell gives: every launcher mode then
hands the verdict (dist_jobs.rundir.verdict) the same evidence as srun does for one task per process.

The first failure is the cause, the others its consequences (the workers torchrun stopped after
it, a peer that lost it): torchrun's own "Root Cause (first observed failure)".
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import main as torchrun

from dist_jobs.rundir.first_failure import note


def exit_code(failure: ProcessFailure) -> int:
    """The code a shell reports for the worker: its own, or 128+N when signal N ended it."""
    return 128 - failure.exitcode if failure.exitcode < 0 else failure.exitcode


def main(argv: list[str] | None = None) -> int:
    try:
        torchrun(sys.argv[1:] if argv is None else argv)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        code = exit_code(failure)
        print(str(exc), file=sys.stderr)  # torchrun's own table of the failures
        how = f"killed by {failure.signal_name()}" if failure.exitcode < 0 else "exited"
        print(f"dist-jobs: torchrun: rank {rank} failed first ({how}): exit {code}", file=sys.stderr, flush=True)
        note(rank, code)  # for the pod's verdict, which sees the exit code only
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
