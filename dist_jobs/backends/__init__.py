"""Backends: slurm, k8s, local and submitit behind one small interface (see base.py)."""
