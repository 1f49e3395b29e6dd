"""Local processes: the job's N x P ranks on this host, with the cluster's environment.

By concept: `jobs` (the Backend: a detached run you can attach to by its run directory),
`launch` (the ranks' environment and the foreground run), `procs` (one end for every process),
`keeper` (a script: each rank's tree dies with the launcher).
"""

from dist_jobs.backends.local.jobs import LocalBackend

BACKEND = LocalBackend

__all__ = ["BACKEND", "LocalBackend"]
