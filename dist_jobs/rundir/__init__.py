"""The run directory, `<checkpoint_dir>/<run>/` on shared storage: what every attempt of a run
shares besides its checkpoints. Stdlib only, so the job script, the launcher and the trainer can
all use it before torch is imported."""
