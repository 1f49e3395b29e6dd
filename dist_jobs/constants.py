"""Facts every layer shares, each stated once (stdlib only, imports nothing)."""

VERSION = "0.1.0"

# Exit code a training process uses to say "checkpointed after a preemption signal, run me
# again". It sits in Kubernetes' retryable range (128-255) for restartPolicy ExitCode and
# above 128+64, so it cannot be mistaken for death by a signal. The sbatch script, the pod
# entrypoint and the local launcher all read it from here.
REQUEUE_EXIT_CODE = 200
"""The exit code that means "requeue me": a preempted run checkpointed and wants to run again."""

# File rank 0 writes into the run directory once a preemption checkpoint is committed; read by
# launchers that cannot see the ranks' exit codes (torchrun stopped by the preemption signal).
PREEMPTED_MARKER = "PREEMPTED"

# What every launcher mode runs torchrun as (`python3 -m ...`): torchrun exiting with its first
# failed worker's code, 128+N for a signal, where torchrun alone exits 1.
TORCHRUN_MODULE = "dist_jobs.train.torchrun"

# Exit code of a pod entrypoint or batch script that refuses to start again: the run has been
# restarted preemption.max_requeues times (dist_jobs.rundir.attempts). In 1-127, so neither
# Kubernetes' restartPolicy ExitCode nor the batch script retries it; distinct from 1 (a bug),
# 2 (bad flags) and 3 (an inconsistent launch).
REQUEUE_LIMIT_EXIT_CODE = 5

# `dist-jobs wait` / `submit --wait`: how the job ended, as the shell sees it. A failed job's
# own exit code is not reused: 2 already means bad input and 200 "requeue me".
WAIT_EXIT_CODES = {"succeeded": 0, "failed": 1, "cancelled": 3, "timeout": 4}

# Exit code of a run that lost its run directory lock to another run (it was paused past the
# stale limit, or cut off): it writes nothing more there and is not requeued. In 1-127, so no
# scheduler retries it; distinct from REQUEUE_LIMIT_EXIT_CODE.
LOCK_LOST_EXIT_CODE = 6
