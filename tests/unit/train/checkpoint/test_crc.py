"""CRC32 on several threads: the combined slices give exactly zlib.crc32 of the whole file."""

from __future__ import annotations

import os
import tempfile
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dist_jobs.train.checkpoint import crc
from support.props import examples


@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_combine_matches_zlib(a: bytes, b: bytes) -> None:
    assert crc.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@settings(max_examples=examples(40), deadline=None)
@given(data=st.binary(max_size=20_000), cpus=st.integers(1, 12))
def test_file_in_slices_matches_zlib(data: bytes, cpus: int) -> None:
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryFile() as f:
        patch.setattr(crc, "_SLICE_MIN", 1000)  # slices of kilobytes instead of 32 MiB
        patch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
        f.write(data)
        f.flush()
        assert crc.crc32_file(f.fileno(), len(data)) == zlib.crc32(data)


def test_only_the_given_size_is_checksummed() -> None:
    with tempfile.TemporaryFile() as f:
        f.write(b"abcdef")
        f.flush()
        assert crc.crc32_file(f.fileno(), 3) == zlib.crc32(b"abc")
