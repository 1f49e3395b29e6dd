"""A local job's logs as `dist-jobs logs` reads them from `<run_dir>/local/output.log`."""

from __future__ import annotations

from pathlib import Path

from dist_jobs.backends.local.jobs import LocalBackend


def _logged(tmp_path: Path, text: bytes) -> str:
    """A finished local job (srun mode) whose launcher wrote `text` to its log."""
    folder = tmp_path / "run" / "local"
    folder.mkdir(parents=True)
    (folder / "pid").write_text("1\n")
    (folder / "exit_code").write_text("0\n")
    (folder / "spec.yaml").write_text("launcher: srun\n")
    (folder / "output.log").write_bytes(text)
    return str(tmp_path / "run")


# What the launcher writes of a program that redraws a bar with "\r" between its log lines.
REDRAWN = (
    b"[rank 0] banner\n"
    b"[rank 0] \r  0%|    | 0/3\r          \r12:00:00 INFO step 1/3\n"
    b"[rank 1] rank one\n"
    b"[rank 0] \r 33%|#   | 1/3\r100%|####| 3/3\n"
)


def test_a_redrawn_line_shows_its_last_state_with_its_rank(tmp_path: Path) -> None:
    job = _logged(tmp_path, REDRAWN)
    assert list(LocalBackend().logs(job)) == [
        "[rank 0] banner",
        "[rank 0] 12:00:00 INFO step 1/3",
        "[rank 1] rank one",
        "[rank 0] 100%|####| 3/3",
    ]
    assert list(LocalBackend().logs(job, rank=0)) == ["banner", "12:00:00 INFO step 1/3", "100%|####| 3/3"]


def test_windows_line_ends_are_not_redraws(tmp_path: Path) -> None:
    job = _logged(tmp_path, b"[rank 0] one\r\n[rank 0] two\r\n")
    assert list(LocalBackend().logs(job, rank=0)) == ["one", "two"]
