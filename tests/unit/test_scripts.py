"""The shell scripts people run by hand (cluster set-up, pod entrypoint) pass shellcheck."""

from __future__ import annotations

import subprocess

import pytest

from support.paths import REPO
from support.tiers import require_tool

SCRIPTS = sorted(
    [*REPO.glob("slurm/cluster/*.sh"), *REPO.glob("k8s/apiserver/*.sh"), REPO / "templates/pod-entrypoint.sh"]
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck_warnings(script) -> None:
    # The pod entrypoint runs as `sh -c` in the user's image. Its `-nt` is not in POSIX but is in
    # dash, busybox ash and bash (the operator harness runs it under Debian's dash): SC3013 is off.
    shell = ["-s", "sh", "-e", "SC3013"] if script.name == "pod-entrypoint.sh" else ["-s", "bash"]
    proc = subprocess.run(
        [require_tool("shellcheck"), "-x", *shell, "-S", "warning", script.name],
        cwd=script.parent,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout
