"""The shell scripts people run by hand (cluster set-up, pod entrypoint) pass shellcheck."""

from __future__ import annotations

import subprocess

import pytest

from support.paths import REPO
from support.tiers import require_tool
from support.waiting import HUNG_S

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


def test_cluster_daemons_do_not_keep_a_callers_lock(tmp_path) -> None:
    """`flock LOCK slurm/cluster/up.sh` must not leave the lock held by the daemons it starts:
    up.sh's spawn runs a daemon that forks into the background (here a shell leaving a `sleep`)."""
    functions = "".join(
        line
        for line in (REPO / "slurm/cluster/up.sh").read_text().splitlines(keepends=True)
        if line.startswith(("close_inherited()", "spawn()"))
    )
    assert functions.count("()") == 2, "up.sh no longer defines close_inherited() and spawn() on one line each"
    lock = tmp_path / "lock"
    daemon = "spawn sh -c 'sleep 30 & echo $! > pid'"
    subprocess.run(
        ["flock", str(lock), "bash", "-c", f"{functions}\n{daemon}"], cwd=tmp_path, check=True, timeout=HUNG_S
    )
    try:
        free = subprocess.run(["flock", "--nonblock", str(lock), "true"], timeout=HUNG_S)
        assert free.returncode == 0, "the backgrounded daemon still holds the caller's lock"
    finally:
        subprocess.run(["kill", (tmp_path / "pid").read_text().strip()], check=False)
