"""dist-jobs: one job spec becomes a SLURM batch script or a Kubeflow PyTorchJob.

Kept import-light on purpose: `dist-jobs render` must not pay for torch, kubernetes or
submitit, so nothing heavy is imported here (tests/test_imports.py guards it).
"""

__version__ = "0.1.0"

# Exit code a training process uses to say "checkpointed after a preemption signal, run me
# again". It sits in Kubernetes' retryable range (128-255) for restartPolicy ExitCode and
# above 128+64, so it cannot be mistaken for death by a signal.
REQUEUE_EXIT_CODE = 200

__all__ = ["__version__", "REQUEUE_EXIT_CODE"]
