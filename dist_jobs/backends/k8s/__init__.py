"""Kubernetes: PyTorchJob and TrainJob objects through the official client's REST layer.

By concept: `backend` (the Backend), `client` (the kubeconfig and the REST client), `errors`
(the apiserver's answers as messages with hints), `ranks` (per-rank detail from pod statuses),
`logs` (every rank's lines from the pods, by global rank).
"""

from dist_jobs.backends.k8s.backend import K8sBackend

BACKEND = K8sBackend

__all__ = ["BACKEND", "K8sBackend"]
