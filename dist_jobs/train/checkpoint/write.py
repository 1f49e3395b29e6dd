"""The writer's machinery: state validation, durable file writes, reusable CPU snapshot buffers
and the one writer thread. `checkpointer.py` is the API; it re-exports CheckpointError.

Training may only be blocked for as long as it takes to copy its tensors somewhere the optimizer
will not touch; serializing, checksumming and fsyncing then happen on a background thread. The
copy targets are allocated once per state-dict path and reused, because allocating (and, for
CUDA, pinning) hundreds of MB per checkpoint costs more than the copy itself: page faults on
fresh memory make a first snapshot much slower than later ones.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import torch

from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.atomic import open_atomic
from dist_jobs.train.checkpoint.crc import crc32_file

# Leaf types torch.load(weights_only=True) accepts. Exact types: numpy scalars subclass float
# but pickle as numpy objects, which weights_only refuses.
_PLAIN = (bool, int, float, complex, str, bytes, type(None))


def _is_leaf(obj: Any) -> bool:
    return type(obj) in _PLAIN or type(obj) in (torch.dtype, torch.device, torch.Size)


class CheckpointError(DistJobsError):
    """A checkpoint could not be written or read; the message names the folder."""


def prepare_state(obj: Any, path: str, on_tensor: Callable[[str, torch.Tensor], torch.Tensor]) -> Any:
    """Rebuild `obj` with on_tensor applied to each tensor; refuse what weights_only cannot load."""
    if isinstance(obj, torch.Tensor):
        return on_tensor(path, obj)
    if _is_leaf(obj):
        return obj
    if isinstance(obj, Mapping):
        out: dict = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for key, value in obj.items():
            if not _is_leaf(key):
                raise _unsafe(f"{path} key {key!r}", key)
            # repr() keeps paths unique ("a.b" vs "a"/"b"): they key the reused snapshot buffers.
            out[key] = prepare_state(value, f"{path}[{key!r}]", on_tensor)
        if getattr(obj, "_metadata", None) is not None:  # nn.Module state_dict versions
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if type(obj) in (list, tuple):
        return type(obj)(prepare_state(v, f"{path}[{i}]", on_tensor) for i, v in enumerate(obj))
    if type(obj) in (set, frozenset) and all(_is_leaf(v) for v in obj):
        return obj
    raise _unsafe(path, obj)


def _unsafe(path: str, obj: Any) -> CheckpointError:
    return CheckpointError(
        f"checkpoint state {path}: a {type(obj).__name__} cannot be loaded with torch.load(weights_only=True)",
        hint="store only tensors, numbers, strings, None, lists, tuples and dicts "
        "(numpy array: torch.from_numpy(a); dataclass: dataclasses.asdict(x))",
    )


class HashingFile:
    """File wrapper for torch.save that checksums bytes on their way to disk (no second read).

    CRC32, not sha256: it guards against torn and bit-rotted files, not against an attacker
    (weights_only loading is the defence there), and it is several times faster than sha256
    (BENCHMARKS.md), which matters because latest() verifies at every resume.

    It also keeps the OSError of a failed write: torch.save turns it into a RuntimeError
    ("unexpected pos ..."), which would hide that the disk is full.
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.size, self.crc = raw, 0, 0
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            written = self.raw.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.crc = zlib.crc32(data, self.crc)
        self.size += memoryview(data).nbytes  # torch may hand over non-byte memoryviews
        return written

    def flush(self) -> None:
        self.raw.flush()


def write_atomic(final: Path, write: Callable[[IO[bytes]], object]) -> dict[str, Any]:
    """One checkpoint file through dist_jobs.rundir.atomic.open_atomic (`final` is either absent or
    whole, never torn), checksummed on the way; the caller fsyncs the folder after its renames."""
    out: HashingFile | None = None
    try:
        with open_atomic(final, sync_dir=False) as raw:
            out = HashingFile(raw)
            write(out)  # type: ignore[arg-type]
    except BaseException as exc:
        if out is not None and out.error is not None and exc is not out.error:
            raise out.error from exc
        raise
    return {"size": out.size, "crc32": f"{out.crc:08x}"}


def regular(path: Path) -> Path:
    """`path`, if it is a regular file: a FIFO or device in a checkpoint would block or never end a read."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise CheckpointError(f"{path} is not a regular file", hint="a checkpoint holds only files dist-jobs wrote")
    return path


def digest(path: Path) -> dict[str, Any]:
    """Size and CRC32 of a file, as write_atomic reports them."""
    with open(regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        return {"size": size, "crc32": f"{crc32_file(f.fileno(), size):08x}"}


def sync_digest(path: Path) -> dict[str, Any]:
    """fsync a written file and take its size and CRC32 (as digest()) at once: the CRC reads the
    page cache on this thread while the fsync, on another, waits on the disk (both release the GIL)."""
    fd = os.open(regular(path), os.O_RDWR)  # open for writing, as the descriptor DCP itself fsyncs
    try:
        size = os.fstat(fd).st_size
        with ThreadPoolExecutor(max_workers=1) as pool:
            synced = pool.submit(os.fsync, fd)
            crc = crc32_file(fd, size)
            synced.result()
    finally:
        os.close(fd)
    return {"size": size, "crc32": f"{crc:08x}"}


def remove(folder: Path) -> None:
    """Delete a folder so that a crash half-way cannot leave something that still counts."""
    (folder / "COMPLETE").unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def wait_for(paths: list[Path], timeout: float) -> list[Path]:
    """Poll until every path exists; return those still missing when `timeout` runs out."""
    deadline, delay = time.monotonic() + timeout, 0.0005
    while paths := [p for p in paths if not p.exists()]:
        if time.monotonic() > deadline:
            return paths
        time.sleep(delay)
        # Slow growth: the wait overshoots the last file by at most a quarter; still under 30
        # stats in the first 0.2 s, then one every 0.1 s, gentle on shared storage.
        delay = min(delay * 1.25, 0.1)
    return []


def free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


class TensorBuffers:
    """CPU copy targets keyed by state-dict path ("shared.model.fc.weight"), reused across saves.

    A buffer is reallocated only when the tensor at that path changes shape or dtype (for example
    the optimizer's momentum appearing after its first step); paths that disappear are released.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._seen: set[str] = set()
        self._pending_cuda = False

    def begin(self) -> None:
        self._seen = set()
        self._pending_cuda = False

    def copy(self, path: str, tensor: torch.Tensor) -> torch.Tensor:
        source = tensor.detach()
        if source.layout != torch.strided:
            # Sparse/quantized tensors are rare in DDP state; a fresh copy is correct if not free.
            return source.to("cpu", copy=True)
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != source.shape or buffer.dtype != source.dtype:
            pin = source.is_cuda  # pinned memory lets the device-to-host copy run asynchronously
            buffer = torch.empty(source.shape, dtype=source.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buffer
        buffer.copy_(source, non_blocking=source.is_cuda)
        self._pending_cuda = self._pending_cuda or source.is_cuda
        self._seen.add(path)
        return buffer

    def end(self) -> None:
        """Finish the snapshot: wait for device copies, drop buffers of vanished paths."""
        if self._pending_cuda:
            torch.cuda.synchronize()
        for path in [p for p in self._buffers if p not in self._seen]:
            del self._buffers[path]

    def buffer(self, path: str) -> torch.Tensor | None:
        return self._buffers.get(path)

    def __len__(self) -> int:
        return len(self._buffers)


class BackgroundWriter:
    """Runs one job at a time on a thread and keeps its exception for the next caller.

    A thread per job (instead of a long-lived worker and a queue) keeps "at most one write in
    flight" trivially true: submit() joins the previous thread first. Threads are non-daemon so
    a checkpoint that has started is finished even if the interpreter exits without close().
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def submit(self, job: Callable[[], None]) -> None:
        self.wait()
        thread = threading.Thread(target=self._run, args=(job,), name=self._name, daemon=False)
        with self._lock:
            self._thread = thread
        thread.start()

    def _run(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as exc:
            with self._lock:
                self._error = exc

    def busy(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Join the in-flight job, then raise its exception (once) if it failed."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join()
        with self._lock:
            self._thread = None
            error, self._error = self._error, None
        if error is not None:
            raise error
