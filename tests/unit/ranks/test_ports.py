"""derive_port: deterministic, outside the ephemeral range, and spread across jobs on a node."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dist_jobs.errors import UsageError
from dist_jobs.ranks.ports import DEFAULT_EPHEMERAL_RANGE, derive_port, ephemeral_range, free_port, main
from support.paths import REPO
from support.waiting import HUNG_S

FAKE_RANGES = [
    (32768, 60999),  # Linux default
    (49152, 65535),  # IANA / Windows-like
    (1024, 9999),  # everything low is ephemeral
    (10000, 65535),  # nothing above 10000 is left: fall back to 1024-9999
    (20000, 30000),
    (40000, 40000),
    (15000, 64000),
]


@pytest.mark.parametrize("ephemeral", FAKE_RANGES)
def test_outside_ephemeral_range_and_above_1024(ephemeral: tuple[int, int]) -> None:
    low, high = ephemeral
    for job in [*range(3000), 2**31 - 1, 2**32 + 17, 10**12]:
        for step in (0, 1, 4294967291):
            port = derive_port(job, step, port_range=ephemeral)
            assert 1024 <= port <= 65535
            assert not low <= port <= high, (job, step, port)
            if ephemeral != (10000, 65535):
                assert port >= 10000


def test_default_range_is_the_kernels() -> None:
    low, high = ephemeral_range()
    for job in range(500):
        assert not low <= derive_port(job) <= high


def test_deterministic_across_processes() -> None:
    want = derive_port(123456, 3)
    assert derive_port(123456, 3) == want
    out = subprocess.run(
        [sys.executable, "-m", "dist_jobs.ranks.ports", "123456", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HUNG_S,
        check=True,
    ).stdout
    assert out == f"{want}\n"


def test_step_changes_the_port() -> None:
    assert len({derive_port(777, step) for step in range(8)}) == 8


@pytest.mark.parametrize("ephemeral", [(32768, 60999), (49152, 65535), (20000, 30000)])
def test_consecutive_jobs_on_one_node_do_not_collide(ephemeral: tuple[int, int]) -> None:
    # Jobs sharing a node usually have nearby ids: 1000 in a row get 1000 distinct ports.
    ports = [derive_port(job, port_range=ephemeral) for job in range(50_000, 51_000)]
    assert len(set(ports)) == 1000
    # Several steps per job as well (job j step 1 must not sit on job j+1 step 0).
    pairs = [derive_port(job, step, port_range=ephemeral) for job in range(80_000, 80_250) for step in range(4)]
    assert len(pairs) - len(set(pairs)) <= 5


def test_unrelated_jobs_collide_no_more_than_chance() -> None:
    # 1000 random ids over ~27k ports: the birthday bound expects ~18 collisions.
    rng = random.Random(20240501)
    ids = rng.sample(range(10**8), 1000)
    ports = [derive_port(job, port_range=DEFAULT_EPHEMERAL_RANGE) for job in ids]
    assert len(ports) - len(set(ports)) <= 40


def test_consecutive_ports_are_spread_apart() -> None:
    # Neighbouring job ids should not get neighbouring ports (a port scan would hit both).
    gaps = [abs(derive_port(j + 1) - derive_port(j)) for j in range(1000, 1100)]
    assert min(gaps) > 100


def test_no_port_left_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="no port outside") as caught:
        derive_port(1, port_range=(1024, 65535))
    assert "MASTER_PORT" in (caught.value.hint or "")


def test_negative_ids_are_refused() -> None:
    with pytest.raises(UsageError, match="must be >= 0"):
        derive_port(-1)
    with pytest.raises(UsageError):
        derive_port(5, -2)


@pytest.mark.parametrize(
    ("content", "want"),
    [
        ("20000\t30000\n", (20000, 30000)),
        ("1024 65535", (1024, 65535)),
        ("garbage", DEFAULT_EPHEMERAL_RANGE),
        ("5 4", DEFAULT_EPHEMERAL_RANGE),
        ("1 2 3", DEFAULT_EPHEMERAL_RANGE),
        ("0 70000", DEFAULT_EPHEMERAL_RANGE),
    ],
)
def test_ephemeral_range_file(tmp_path: Path, content: str, want: tuple[int, int]) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(content)
    assert ephemeral_range(path) == want


def test_ephemeral_range_missing_file(tmp_path: Path) -> None:
    assert ephemeral_range(tmp_path / "absent") == DEFAULT_EPHEMERAL_RANGE


def test_main(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["42"]) == 0
    assert capsys.readouterr().out == f"{derive_port(42)}\n"
    assert main(["42", "7"]) == 0
    assert capsys.readouterr().out == f"{derive_port(42, 7)}\n"
    for bad in ([], ["x"], ["-1"], ["1", "2", "3"]):
        assert main(bad) == 2
        assert "usage:" in capsys.readouterr().err


def test_free_port_skips_a_busy_port_and_stays_outside_the_ephemeral_range() -> None:
    first = free_port(4242)
    assert free_port(4242) == first  # a seed (the pid) gives the same port while it is free
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first))
        busy.listen()
        other = free_port(4242)
    assert other != first
    low, high = ephemeral_range()
    assert not low <= other <= high


def test_unseeded_free_ports_differ_so_jobs_of_one_process_do_not_share_one() -> None:
    assert len({free_port() for _ in range(8)}) > 1
