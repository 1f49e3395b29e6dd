"""CRC32 of a file on several cores: the checksum a checkpoint's marker records for each file.

On one core zlib.crc32 took longer to check a checkpoint file than loading it through a memory
map did (BENCHMARKS.md). zlib releases the GIL, so threads checksum slices of the
mapped file at once, and the slices' CRCs are combined with zlib's crc32_combine, written out
below because Python's zlib module does not expose it. The result is the plain CRC32 of the file.
"""

from __future__ import annotations

import mmap
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

_POLY = 0xEDB88320  # CRC-32 (reflected), the polynomial zlib uses
_SLICE_MIN = 32 << 20  # below this, one thread: starting others costs more than it saves
_THREADS_MAX = 8


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial, bit-reflected (zlib's multmodp)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table, p = [], 1 << 30  # x^1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()  # x^(2^k) modulo the polynomial


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC32 of A+B from crc1 = CRC32(A), crc2 = CRC32(B) and len2 = len(B) (zlib's crc32_combine)."""
    p, k, n = 1 << 31, 3, len2  # x^0; multiplying by x^(8 * len2) shifts crc1 past B's bytes
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


def crc32_file(fd: int, size: int) -> int:
    """CRC32 of the first `size` bytes of an open file, read once through a memory map."""
    if not size:
        return 0
    threads = min(_THREADS_MAX, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    count = max(1, min(threads, size // _SLICE_MIN))
    bounds = [size * i // count for i in range(count + 1)]
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped, memoryview(mapped) as view:
        slices = [view[a:b] for a, b in zip(bounds, bounds[1:])]
        try:
            if count == 1:
                return zlib.crc32(slices[0])
            with ThreadPoolExecutor(max_workers=count) as pool:
                crcs = list(pool.map(zlib.crc32, slices))
        finally:
            for part in slices:  # the map cannot close while a slice of it is exported
                part.release()
    crc = crcs[0]
    for part_crc, a, b in zip(crcs[1:], bounds[1:], bounds[2:]):
        crc = crc32_combine(crc, part_crc, b - a)
    return crc
