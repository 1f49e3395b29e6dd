"""A request too big for the cluster names the limit with the cluster's numbers (real sinfo)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dist_jobs.backends.slurm.backend import SlurmBackend
from dist_jobs.backends.slurm.limits import memory_mb, too_big
from dist_jobs.errors import BackendError
from dist_jobs.spec.load import load_spec
from support.paths import TESTS

SINFO = (TESTS / "fixtures" / "slurm" / "sinfo_nodes.txt").read_text()
BASE = {"name": "big", "nodes": 2, "procs_per_node": 2, "cpus_per_task": 1}


def test_three_nodes_on_two_blames_nodes_not_cpus() -> None:
    err = too_big(load_spec(data={**BASE, "nodes": 3}), SINFO)
    assert err is not None
    assert err.message == "the job is too big for this cluster: nodes: 3 requested, the default partition has 2"
    assert err.hint == "ask for nodes: 2 or fewer"


def test_cpus_and_memory_name_both_numbers() -> None:
    err = too_big(load_spec(data={**BASE, "procs_per_node": 2, "cpus_per_task": 2, "memory": "8G"}), SINFO)
    assert err is not None
    assert "CPUs per node: 2 processes x 2 cpus_per_task = 4, the largest node has 2" in err.message
    assert "memory: 8G per node (8192 MB), the largest node has 4000 MB" in err.message
    assert "nodes:" not in err.message


def test_a_fitting_request_or_another_partition_says_nothing() -> None:
    assert too_big(load_spec(data={**BASE, "memory": "2G"}), SINFO) is None
    assert too_big(load_spec(data={**BASE, "nodes": 3, "slurm": {"partition": "gpu"}}), SINFO) is None


@pytest.mark.parametrize("text, mb", [("64G", 65536), ("4000", 4000), ("500M", 500), ("1T", 1048576), ("x", None)])
def test_memory_units(text: str, mb: float | None) -> None:
    assert memory_mb(text) == mb


def test_submit_rejected_by_sbatch_asks_sinfo_and_names_the_limit(tmp_path: Path) -> None:
    said = (TESTS / "fixtures" / "slurm" / "sbatch_err_too_many_cpus.txt").read_text()

    def runner(argv: list[str]) -> subprocess.CompletedProcess[str]:
        if argv[0] == "sbatch":
            return subprocess.CompletedProcess(argv, 1, "", said)
        return subprocess.CompletedProcess(argv, 0, SINFO, "")

    slurm = SlurmBackend(runner=runner, jobs_dir=tmp_path / "runs", cwd=tmp_path, cluster="c")
    spec = load_spec(data={**BASE, "nodes": 3, "command": ["true"], "log_dir": str(tmp_path / "logs")})
    with pytest.raises(BackendError, match="nodes: 3 requested, the default partition has 2"):
        slurm.schedule(slurm.prepare(spec))
