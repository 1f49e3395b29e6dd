"""Fencing at the storage (issue 36): a checkpoint write that passed its run's fence and then
stalled (SIGSTOP, a suspended job, an NFS stall) lands after another run took the run directory
over. It must change nothing the new holder wrote or counts: each holder stages into a partial
folder of its own (named by its lock's stamp), and a commit never moves a committed step aside.

Two runs on one folder, each a world of 2 ranks as Checkpointer objects on this thread (sync
writes: a rank's save returns once its file is in; rank 0's once the step is committed). The
stall is the moment the old run's own fence is called, where the new run does its whole save."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from support.tiers import require_module

torch = require_module("torch")

from dist_jobs.rundir.lock import Fence  # noqa: E402
from dist_jobs.train.checkpoint.checkpointer import Agree, Checkpointer  # noqa: E402

OLD = Fence(Path("LOCK"), "token-of-the-run-that-was-suspended").stamp
NEW = Fence(Path("LOCK"), "token-of-the-run-that-took-over").stamp


def ranks(folder: Path, stamp: str, **options: object) -> list[Checkpointer]:
    return [Checkpointer(folder, rank=r, world_size=2, stamp=stamp, **options) for r in (1, 0)][::-1]  # type: ignore[arg-type]


def save(run: list[Checkpointer], step: int, who: str) -> None:
    """Rank 1's part, then rank 0's, which commits."""
    run[1].save(step, None, {"who": who})
    run[0].save(step, {"model": torch.full((4,), float(step)), "who": who}, {"who": who})


def saved_by(folder: Path, step: int) -> tuple[str, str, str]:
    """Who wrote step-N's shared state, rank 0's and rank 1's parts, as a reader loads them."""
    zero, one = (Checkpointer(folder, rank=r, world_size=2).load(step) for r in (0, 1))
    assert zero.rank_state is not None and one.rank_state is not None
    return zero.shared["who"], zero.rank_state["who"], one.rank_state["who"]


def test_stamps_name_the_holder_and_are_safe_in_a_file_name() -> None:
    assert OLD != NEW and len(OLD) == 12 and OLD.isalnum()
    assert Fence(Path("LOCK"), "a/b c..d").stamp.isalnum()  # a pod entrypoint's token, or anything


def test_a_late_rank_file_of_the_old_run_is_neither_skipped_for_nor_committed_by_the_new_one(tmp_path: Path) -> None:
    old, new = ranks(tmp_path, OLD), ranks(tmp_path, NEW)
    old[1].save(8, None, {"who": "old"})  # passed its fence before the takeover, landed after it
    save(new, 8, "new")
    assert saved_by(tmp_path, 8) == ("new", "new", "new")
    save(new, 12, "new")  # the new run's later commits prune the old run's leftover
    assert not list(tmp_path.glob(".step-8.*"))


@pytest.mark.parametrize("pruned", [False, True], ids=["renamed-onto-the-new-step", "pruned-by-the-new-run"])
def test_a_late_commit_of_the_old_run_leaves_the_new_runs_step_in_place(tmp_path: Path, pruned: bool) -> None:
    """The old run's rename finds step-8 committed by the new run, or finds its own partial folder
    gone: the new run's pruner (its thread, after its commit) removes every partial folder up to
    the step it committed, the old run's too. Either way the old run drops its copy, quietly."""
    tidy = threading.Event()  # the new run's pruner waits for it
    new = ranks(tmp_path, NEW, fence=lambda doing: tidy.wait(60) if doing.startswith("point") else None)

    def stalls(doing: str) -> None:  # the old rank 0 passed this fence, then stopped; meanwhile:
        if doing == "commit checkpoint step-8":
            save(new, 8, "new")
            if pruned:
                tidy.set()
                new[0].wait()

    old = ranks(tmp_path, OLD, fence=stalls)
    save(old, 8, "old")  # its rename fails: it drops its own copy
    tidy.set()
    new[0].wait()
    assert saved_by(tmp_path, 8) == ("new", "new", "new")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".step-", "step-"))) == ["step-8"]


def agreeing() -> list[Agree]:
    """Two ranks' all_reduce(max), as resume() hands latest() one: each waits for the other."""
    offered: dict[int, list[int]] = {}
    meet = threading.Barrier(2)

    def of(rank: int) -> Agree:
        def agree(values: list[int]) -> list[int]:
            offered[rank] = values
            meet.wait(60)
            found = [max(pair) for pair in zip(offered[0], offered[1])]
            meet.wait(60)
            return found

        return agree

    return [of(0), of(1)]


def test_a_copy_the_ranks_found_damaged_is_still_replaced(tmp_path: Path) -> None:
    run = ranks(tmp_path, NEW)
    save(run, 4, "first")
    # Its pruning done (as for the run that resumes it later): rank 0's pruner removes partial
    # folders of step 4 and below, and the rewrite below stages step 4 again.
    run[0].wait()
    (tmp_path / "step-4" / "rank-1.pt").write_bytes(b"torn")
    found: dict[int, object] = {}
    agree = agreeing()

    def latest(rank: int) -> None:
        try:
            found[rank] = run[rank].latest(agree[rank])
        except BaseException as exc:  # said below, not lost on its thread
            found[rank] = exc

    threads = [threading.Thread(target=latest, args=(r,)) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert found == {0: None, 1: None}  # both agree step-4 is bad: they rewrite it
    save(run, 4, "again")
    assert saved_by(tmp_path, 4) == ("again", "again", "again")
