"""git in a test's own project folder: a committer and no signing, whatever the machine's config."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(cwd: Path, *args: str) -> str:
    user = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *user, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout
