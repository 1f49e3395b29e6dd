"""Reading the spec: small hostile inputs fail at once with exit 2 and a fix, never hang or crash."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from dist_jobs.errors import SpecError
from dist_jobs.spec.load import load_spec
from support.paths import PYTHON
from support.waiting import HUNG_S

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi")
)  # about 1 KB: 9^9 (387 million) values once expanded


def render(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, "-m", "dist_jobs", "render", "--backend", "slurm", "--procs-per-node", "1", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def refused(proc: subprocess.CompletedProcess[str], *words: str) -> bool:
    text = proc.stderr
    return proc.returncode == 2 and "Traceback" not in text and all(w in text for w in words) and "fix:" in text


def test_alias_bomb_in_a_file_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    assert len(BOMB) < 1100
    start = time.monotonic()
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert time.monotonic() - start < 5 and "expands to more than" in str(err.value)


def test_alias_bomb_in_set_is_refused() -> None:
    value = "{" + BOMB.strip().replace("\n", ", ") + "}"
    proc = render("--set", f"env={value}", timeout=20)
    assert refused(proc, "--set env", "expands to more than"), proc.stderr


def test_deep_nesting_is_refused_without_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("env: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert refused(render(str(path)), "nests more than")
    assert refused(render("--set", "env=" + "[" * 100_000), "nests more than")


@pytest.mark.parametrize("make", ["fifo", "device", "directory"])
def test_only_regular_files_are_read(tmp_path: Path, make: str) -> None:
    path = {"device": Path("/dev/zero"), "directory": tmp_path}.get(make, tmp_path / "spec.fifo")
    if make == "fifo":
        os.mkfifo(path)
    assert refused(render(str(path), timeout=20), "not a regular file")


def test_a_spec_over_1_mib_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("name: a\n" + "#" * (1 << 20) + "\n")
    assert refused(render(str(path)), "larger than 1 MiB")


def test_non_utf8_file_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: a\nenv:\n  CITY: M\u00fcnchen\n".encode("latin-1"))
    assert refused(render(str(path)), "not UTF-8", "0xfc on line 3", "UTF-8")


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("name: a\nnodes: 2\nslurm:\n  partition: gpu\n  partition: cpu\n")
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert "'partition' is given twice" in str(err.value) and "line 5" in str(err.value)


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("name: a\nprocs_per_node: 1\nenv:\n  <<: {A: '1', B: '2'}\n  A: '3'\n")
    assert load_spec(path).env == {"A": "3", "B": "2"}


def test_base60_time_stays_text(tmp_path: Path) -> None:
    path = tmp_path / "time.yaml"
    path.write_text("name: a\nprocs_per_node: 1\ntime: 1:30:00\n")
    assert load_spec(path).time == "1:30:00"
    proc = render("--set", "time=1:30:00")
    assert proc.returncode == 0 and "#SBATCH --time=01:30:00" in proc.stdout


@pytest.mark.parametrize(
    "data,field,words",
    [
        ({"time": "99999999"}, "time", "at most 365-00:00:00"),
        ({"command": ["-x", "train.py"]}, "command[0]", "leading '-'"),
        ({"command": ["python3", "x" * (128 * 1024)]}, "command[1]", "Argument list too long"),
        ({"env": {"BIG": "v" * (128 * 1024)}}, "env.BIG", "Argument list too long"),
        ({"train": {"data_root": "/d" + "/x" * 66000}}, "train (one of its flags)", "Argument list too long"),
        ({"checkpoint_dir": "/shared/" + "é" * 128 + "/ck"}, "checkpoint_dir", "256 bytes"),
        ({"train": {"data_root": "/data/" + "d" * 256}}, "train.data_root", "256 bytes"),
        # issue 29: every field that reaches argv or a path, container mounts and images included
        ({"slurm": {"container_mounts": ["/d:" + "/x" * 66000]}}, "slurm.container_mounts[0]", "Argument list"),
        ({"slurm": {"container_mounts": ["/a:/a", "/d:/" + "x" * 140000]}}, "slurm.container_mounts[1]", "Argument"),
        ({"slurm": {"container_mounts": ["/d:/" + "x/" * 20000] * 4}}, "slurm.container_mounts", "all mounts"),
        ({"image": "r/" + "x" * (128 * 1024)}, "image", "Argument list too long"),
        ({"checkpoint_dir": "/ck" + "/d" * 2047}, "checkpoint_dir", "path of 4097 bytes"),
        ({"log_dir": "l/" * 2048}, "log_dir", "4095 (PATH_MAX)"),
        ({"workdir": "/w" * 2048}, "workdir", "PATH_MAX"),
        ({"python": "/p" * 2048}, "python", "PATH_MAX"),
        ({"image": "--foo=bar", "slurm": {"container": "apptainer"}}, "image", "read it as one of their own options"),
        ({"python": "-x"}, "python", "own options"),
        ({"slurm": {"container_mounts": ["/a:/a", "-B/x:/y"]}}, "slurm.container_mounts[1]", "own options"),
    ],
)
def test_limits_of_the_os_and_scheduler_are_checked_up_front(data: dict, field: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(data={"name": "a", "procs_per_node": 1, **data})
    got = {p.field: p.render() for p in err.value.problems}
    assert field in got and words in got[field], got


def test_a_non_utf8_argument_is_refused_for_every_backend() -> None:
    """A raw byte from the command line cannot go into a manifest (it once crashed the YAML emitter)."""
    argv = [PYTHON.encode(), b"-m", b"dist_jobs", b"render", b"--backend", b"k8s", b"--image", b"i:1"]
    proc = subprocess.run(
        [*argv, b"--procs-per-node", b"1", b"--env", b"A=\xff", b"--", b"python3", b"t\xff.py"],
        capture_output=True,
        timeout=HUNG_S,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err and "env.A" in err and "command[1]" in err
    assert "not UTF-8" in err
