"""The reading side of a checkpoint: the COMPLETE marker's format, and files verified as they load.

COMPLETE is one JSON line (step, world size, version, time, size and CRC32 of `shared.pt`)
followed by one record per rank, `rank-<r>.pt <size> <crc32>` padded to RECORD bytes. A rank
reads the JSON line and its own record at a computed offset, so what one rank reads at resume
does not grow with the world size. (With a JSON entry per rank, every rank of a 4,096-rank job
would read and parse ~300 KB of it: 1.2 GB read from one file at the moment the job restarts.)

Each file is read once. A small one is read whole, checksummed, and unpickled from those bytes.
A large one is memory-mapped: the checksum pass brings its pages into the page cache, and
torch.load(mmap=True) maps those same pages, so the tensors are not copied into fresh memory
(page faults on fresh memory cost more than the copy); load_state_dict then copies them into
the live model, once. Loading stays weights_only=True.

A rank's file may also vouch for other files of the folder that rank wrote (DCP's shards, under
FILES: name -> size and CRC32): verify_files() checks them, one read pass each, before they count.

newest_agreed() is how the ranks settle on one checkpoint, each having checked only its part.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import stat
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import torch

from dist_jobs.train.checkpoint.crc import crc32_file

SHARED = "shared.pt"
RECORD = 64  # bytes per rank record; "rank-4294967295.pt" + a 20-digit size + 8 hex digits fit
MAP_FROM = 1 << 20  # files this large or larger are memory-mapped; smaller ones are read whole
_HEAD_MAX = 4096  # the JSON line is ~200 bytes; a longer one means the file is not ours
FILES = "files"  # key of a rank's file: {name: {"size", "crc32"}} of the other files that rank wrote

# Element-wise maximum of a few ints over all ranks: one all_reduce (distributed.max_over_ranks).
Agree = Callable[[list[int]], list[int]]
T = TypeVar("T")


def unusable(folder: Path, rank: int, exc: Exception | None) -> str:
    """The warning for a checkpoint latest() skips: which file is wrong, and what happens instead
    (`exc` None: another rank could not load it)."""
    if exc is None:
        what = f"checkpoint {folder} is not usable on every rank (that rank's log says why)"
    elif isinstance(exc, FileNotFoundError):
        what = f"checkpoint {folder} is unusable on rank {rank}: {exc.filename} is missing"
    elif isinstance(exc, KeyError):  # its text is the key alone
        what = f"checkpoint {folder} is unusable on rank {rank}: its COMPLETE marker has no {exc.args[0]!r} entry"
    else:
        what = f"checkpoint {folder} is unusable on rank {rank}: {str(exc) or type(exc).__name__}"
    return what + "; skipped: resuming from the newest older checkpoint every rank can load (the start if none)"


def newest_agreed(
    steps: list[int],
    load: Callable[[int], T],
    reject: Callable[[int, T | Exception | None], None],
    agree: Agree | None = None,
) -> T | None:
    """The newest of `steps` that every rank loaded; None when there is none.

    Each round every rank offers its newest candidate as [step, -step, failed]. The maximum says
    whether all offered the same step and all loaded it. If not, every rank rejects the highest
    step offered (one rank's part is bad, or a rank does not see that step) and offers its next;
    a rank that offered a lower step keeps what it loaded. Without `agree`, this rank decides alone.
    """
    agree = agree or (lambda values: values)
    todo = sorted(steps, reverse=True)
    tried: dict[int, T | Exception] = {}
    while True:
        step = todo[0] if todo else -1
        if step >= 0 and step not in tried:
            try:
                tried[step] = load(step)
            except Exception as exc:  # any failure makes it unusable; an older one may do
                tried[step] = exc
        got = tried.get(step)
        top, minus_lowest, failed = agree([step, -step, int(isinstance(got, Exception))])
        if not failed and top == -minus_lowest:
            return None if step < 0 or isinstance(got, Exception) else got
        reject(top, tried.pop(top, None))
        if step == top:
            todo.pop(0)


@dataclass(frozen=True)
class Marker:
    """What this rank needs of COMPLETE: mine is None for a rank the saving world did not have."""

    step: int
    world_size: int
    shared: Mapping[str, Any]
    mine: Mapping[str, Any] | None


def encode_marker(head: Mapping[str, Any], shared: Mapping[str, Any], ranks: Sequence[Mapping[str, Any]]) -> bytes:
    """COMPLETE's bytes: `head` (step, world_size, ...) as one JSON line, then the rank records."""
    line = json.dumps({**head, "files": {SHARED: dict(shared)}, "rank_record_bytes": RECORD})
    records = [f"rank-{r}.pt {d['size']} {d['crc32']}".ljust(RECORD - 1) + "\n" for r, d in enumerate(ranks)]
    if any(len(r) != RECORD for r in records):
        raise ValueError(f"a rank record is longer than {RECORD} bytes")
    return (line + "\n" + "".join(records)).encode()


def read_marker(path: Path, rank: int) -> Marker:
    """The JSON line and this rank's record only: two small reads, whatever the world size."""
    with open_regular(path) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        chunk = os.pread(fd, _HEAD_MAX, 0)
        if chunk.startswith(b"{\n"):  # written before rank records existed: all of it is JSON
            return _legacy(json.loads(chunk + os.pread(fd, size, len(chunk))), rank, path)
        end = chunk.find(b"\n")
        if end < 0:
            raise ValueError(f"{path.name} has no header line")
        head = json.loads(chunk[:end])
        step, world, width = int(head["step"]), int(head["world_size"]), int(head["rank_record_bytes"])
        start = end + 1
        if size != start + world * width:
            raise ValueError(f"{path.name} is {size} bytes, not the {start + world * width} it says")
        mine = _record(os.pread(fd, width, start + rank * width), rank) if rank < world else None
    return Marker(step, world, _shared_record(head, path), mine)


def _shared_record(head: Mapping[str, Any], path: Path) -> Mapping[str, Any]:
    """COMPLETE's size and CRC32 of shared.pt; a marker without them vouches for nothing."""
    files = head.get("files")
    if not isinstance(files, dict) or not isinstance(files.get(SHARED), dict):
        raise ValueError(f"{path} records no size and CRC32 for {path.parent / SHARED}")
    return files[SHARED]


def _record(raw: bytes, rank: int) -> dict[str, Any]:
    fields = raw.decode("ascii").split()
    if len(fields) != 3 or fields[0] != f"rank-{rank}.pt":
        raise ValueError(f"the record of rank {rank} in COMPLETE is {raw!r}")
    return {"size": int(fields[1]), "crc32": fields[2]}


def _legacy(marker: Mapping[str, Any], rank: int, path: Path) -> Marker:
    shared = _shared_record(marker, path)
    files = marker["files"]
    world = int(marker["world_size"])
    mine = files.get(f"rank-{rank}.pt") if rank < world else None
    if rank < world and mine is None:  # names in the marker never pick a file: they only vouch for one
        raise ValueError(f"COMPLETE has no record of rank-{rank}.pt")
    return Marker(int(marker["step"]), world, shared, mine)


def load_verified(path: Path, want: Mapping[str, Any]) -> Any:
    """torch.load(weights_only=True) of a file whose size and CRC32 match `want`, reading it once.

    A checksum error is raised before any unpickling: it says what is wrong more clearly than
    whatever a torn file makes torch.load report.
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        _check(path, size, None, want)  # a truncated file fails before it is read
        # A shared map would write training's in-place updates back into the checkpoint.
        if size < MAP_FROM or torch.serialization.get_default_mmap_options() != mmap.MAP_PRIVATE:
            data = f.read()
            _check(path, len(data), zlib.crc32(data), want)
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        _check(path, size, crc32_file(f.fileno(), size), want)
    return torch.load(path, mmap=True, weights_only=True, map_location="cpu")


def verify_files(folder: Path, records: Any, by: str) -> None:
    """Size and CRC32 of each file `records` (a FILES entry of the verified rank file `by`) lists:
    the size before reading, then the CRC32 through a memory map, whose pages a load then reuses."""
    if not isinstance(records, dict):
        raise ValueError(f"{by} lists its files as {type(records).__name__}, not a dict")
    for name, want in records.items():
        # A name only vouches for a file of this folder, never picks one elsewhere.
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            raise ValueError(f"{by} lists {name!r}, which is not a file name")
        path = folder / name
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            _check(path, size, None, want, by)
            _check(path, size, crc32_file(f.fileno(), size), want, by)


def _check(path: Path, size: int, crc: int | None, want: Mapping[str, Any], by: str = "COMPLETE") -> None:
    """crc None: the size alone (checked before the file is read)."""
    got = f"{size} bytes" + ("" if crc is None else f" with crc32 {crc:08x}")
    if size != want["size"] or (crc is not None and f"{crc:08x}" != want["crc32"]):
        raise ValueError(f"{path.name} is damaged: {got}, {by} says {want['size']} bytes with crc32 {want['crc32']}")


def open_regular(path: Path) -> IO[bytes]:
    """Open for reading, refusing anything but a regular file (opening a FIFO would block)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # no effect on a regular file's reads
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{path.name} is not a regular file (mode {stat.filemode(mode)})")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
