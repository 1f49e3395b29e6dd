"""The runtime side: the shared DDP training entrypoint (`python -m dist_jobs.train`).

This package's __init__ stays light: the job spec imports `dist_jobs.spec.train` at render
time, so torch is imported only by the modules that train.
"""
