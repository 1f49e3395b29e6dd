"""git in a test's own project folder: a committer and no signing, whatever the machine's config."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path


def git(cwd: Path, *args: str) -> str:
    user = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *user, *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_project(root: Path, committed: Mapping[str, str | bytes], then: Mapping[str, str | bytes]) -> Path:
    """A git project at `root`: the `committed` files (path: text or bytes) in its one commit, and
    then the `then` files written over it (edited, untracked or ignored files)."""

    def write(files: Mapping[str, str | bytes]) -> None:
        for name, content in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)

    write(committed)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    write(then)
    return root
