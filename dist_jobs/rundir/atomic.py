"""Atomic file writes: the one way dist-jobs replaces or creates a file others may read.

`write_atomic` writes a temporary file in the same folder, flushes and fsyncs it, renames it over
the target and fsyncs the folder: a reader sees the old file or the new one, never half of one,
and after a crash the rename is on disk or it is not. `open_atomic` is the same for a writer that
streams into a file object (a checkpoint part). `write_new` creates the file only if it does not
exist yet (first writer wins), also on NFS. Stdlib only: job scripts import it before any
environment is set up.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def _encode(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _temporary(path: Path) -> Path:
    # Unique per writer: two processes (or threads) replacing the same file never share one.
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")


@contextmanager
def open_dir(path: Path) -> Iterator[int]:
    """A directory handle: it follows the folder through renames."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the renames and creations in `path` durable."""
    with open_dir(path) as fd:
        os.fsync(fd)


@contextmanager
def open_atomic(path: Path, *, sync_dir: bool = True, durable: bool = True) -> Iterator[BinaryIO]:
    """A binary file that replaces `path` when the block ends without an error; on an error the
    temporary file is removed and `path` is untouched. `sync_dir=False` for a caller that fsyncs
    the folder itself after several renames (a checkpoint); `durable=False` (no fsync at all) for
    a file worth nothing after a crash, rewritten every few seconds (a rank's beat)."""
    path = Path(path)
    tmp = _temporary(path)
    try:
        with open(tmp, "wb") as fh:
            yield fh
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir and durable:
        fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes | str, *, mkdir: bool = False, durable: bool = True) -> Path:
    """Replace `path` with `data` (str is written as UTF-8) atomically, and durably unless told not to."""
    path = Path(path)
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    with open_atomic(path, durable=durable) as fh:
        fh.write(_encode(data))
    return path


def write_new(path: Path, data: bytes | str) -> bool:
    """Create `path` holding `data` unless it exists (True when this call created it); the content
    appears all at once."""
    path, raw = Path(path), _encode(data)
    tmp = _temporary(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        # NFS: a retransmitted LINK whose first try succeeded answers EEXIST; the count tells.
        return _linked(tmp)
    except OSError:
        # A failure after success, as above; a filesystem without hard links gets O_EXCL instead
        # (its content then shows a moment later).
        return _linked(tmp) or _create_exclusive(path, raw)
    finally:
        tmp.unlink(missing_ok=True)


def _linked(tmp: Path) -> bool:
    try:
        return os.stat(tmp).st_nlink == 2
    except OSError:
        return False


def _create_exclusive(path: Path, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True
