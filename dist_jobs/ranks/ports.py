"""A rendezvous port every task of a job step can compute on its own, without talking.

`derive_port(job_id, step_id)` is deterministic, so all ranks agree; it stays outside the
kernel's ephemeral range, so an outgoing connection of another process on the node cannot
already hold it; and consecutive job ids land far apart, so jobs sharing a node rarely
collide. A `MASTER_PORT` set by the user or the launcher wins; callers check it first.

    python -m dist_jobs.ranks.ports JOB_ID [STEP_ID]
"""

from __future__ import annotations

import math
import random
import socket
import sys
from pathlib import Path
from typing import TextIO

from dist_jobs.errors import UsageError

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default, used where /proc is unreadable (macOS, locked-down containers).
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)
# Below 10000 live many well-known services; below 1024 needs root.
PREFERRED_LOW = 10000
PRIVILEGED_END = 1023
MAX_PORT = 65535
LOOPBACK = "127.0.0.1"
# Fibonacci hashing: stepping by span/phi spreads consecutive job ids over the whole space.
_GOLDEN = (math.sqrt(5) - 1) / 2


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range, or Linux's default when it cannot be read."""
    try:
        low_text, high_text = path.read_text().split()
        low, high = int(low_text), int(high_text)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    if not 0 < low <= high <= MAX_PORT:
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def usable_segments(ephemeral: tuple[int, int]) -> list[tuple[int, int]]:
    """Inclusive port ranges outside `ephemeral`: 10000-65535 if any is free, else 1024-9999."""
    low, high = ephemeral
    for floor, ceiling in ((PREFERRED_LOW, MAX_PORT), (PRIVILEGED_END + 1, PREFERRED_LOW - 1)):
        segments = [
            (start, end)
            for start, end in ((floor, min(ceiling, low - 1)), (max(floor, high + 1), ceiling))
            if start <= end
        ]
        if segments:
            return segments
    return []


def derive_port(job_id: int, step_id: int = 0, *, port_range: tuple[int, int] | None = None) -> int:
    """The port for (job, step); `port_range` is the ephemeral range to avoid (default: the kernel's)."""
    if job_id < 0 or step_id < 0:
        raise UsageError(
            f"job id {job_id} / step id {step_id}: both must be >= 0",
            hint="pass the scheduler's numeric ids, e.g. $SLURM_JOB_ID and $SLURM_STEP_ID",
        )
    ephemeral = ephemeral_range() if port_range is None else port_range
    segments = usable_segments(ephemeral)
    if not segments:
        raise UsageError(
            f"no port outside the ephemeral range {ephemeral[0]}-{ephemeral[1]} is left",
            hint="export MASTER_PORT to a port you know is free on the first node",
        )
    span = sum(end - start + 1 for start, end in segments)
    index = (job_id * _multiplier(span) + step_id) % span
    for start, end in segments:
        size = end - start + 1
        if index < size:
            return start + index
        index -= size
    raise AssertionError("index is below span by construction")


def _multiplier(span: int) -> int:
    """About span/phi, and coprime with span, so `span` consecutive job ids never collide."""
    candidate = max(1, round(span * _GOLDEN))
    while math.gcd(candidate, span) != 1:
        candidate += 1
    return candidate


def free_port(seed: int | None = None, attempts: int = 16) -> int:
    """A port that can be bound on the loopback right now, outside the ephemeral range: derived
    from `seed` (one process's pid gives it the same port each time), or from a random seed so
    that several jobs started by one process get different ports."""
    base = random.SystemRandom().randrange(2**31) if seed is None else seed
    for attempt in range(attempts):
        port = derive_port(base, attempt)
        if bindable(port):
            return port
    # Everything tried is busy: return the first and let the bind error speak for itself.
    return derive_port(base)


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # TCPStore binds with SO_REUSEADDR, so a port in TIME_WAIT is fine for it too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


_USAGE = "usage: python -m dist_jobs.ranks.ports JOB_ID [STEP_ID]"


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of `python -m dist_jobs.ranks.ports`: prints the derived port."""
    args = list(sys.argv[1:] if argv is None else argv)
    stream = sys.stdout if out is None else out
    if not 1 <= len(args) <= 2 or not all(arg.isascii() and arg.isdigit() for arg in args):
        sys.stderr.write(_USAGE + "\n")
        return 2
    try:
        port = derive_port(*(int(arg) for arg in args))
    except UsageError as error:
        sys.stderr.write(f"error: {error}\n")
        return error.exit_code
    stream.write(f"{port}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
