"""The pre-rendezvous self-check: one message per kind of mismatch, and sound launches pass."""

from __future__ import annotations

import pytest

from dist_jobs.errors import RankError, UsageError
from dist_jobs.ranks import RankInfo, resolve
from dist_jobs.ranks.selfcheck import check, device_index, is_loopback, rendezvous_timeout

SPEC_2x4 = {"DIST_JOBS_NNODES": "2", "DIST_JOBS_NPROC_PER_NODE": "4"}


def rank(
    rank: int = 0,
    local: int = 0,
    world: int = 8,
    local_world: int = 4,
    node: int = 0,
    nodes: int = 2,
    addr: str = "gpu07",
    port: int = 29500,
    source: str = "slurm",
) -> RankInfo:
    return RankInfo(rank, local, world, local_world, node, nodes, addr, port, source)


def problems_of(info: RankInfo, **kwargs: object) -> tuple[RankError, list[str]]:
    with pytest.raises(RankError) as caught:
        check(info, **kwargs)  # type: ignore[arg-type]
    return caught.value, caught.value.problems  # type: ignore[attr-defined]


@pytest.mark.parametrize("node", [0, 1])
@pytest.mark.parametrize("local", [0, 3])
def test_sound_two_by_four_launch_passes(node: int, local: int) -> None:
    check(rank(node * 4 + local, local, node=node), environ=SPEC_2x4, device_count=4)


def test_three_nodes_of_eight_gpus_with_four_procs_passes() -> None:
    for r in range(12):
        info = rank(r, r % 4, 12, 4, r // 4, 3)
        check(info, expected_nodes=3, expected_procs_per_node=4, environ={}, device_count=8)


def test_one_gpu_bound_per_task_passes() -> None:
    # srun --gpus-per-task=1: each task sees only its own GPU, as device 0.
    env = {**SPEC_2x4, "CUDA_VISIBLE_DEVICES": "3"}
    check(rank(7, 3, node=1), environ=env, device_count=1)
    assert device_index(rank(7, 3, node=1), env) == 0


def test_world_size_mismatch() -> None:
    error, problems = problems_of(rank(0, 0, 6, 3), environ=SPEC_2x4)
    assert any(
        "world size 6 (slurm: SLURM_STEP_NUM_TASKS) != 2 nodes (DIST_JOBS_NNODES) x 4 processes "
        "per node (DIST_JOBS_NPROC_PER_NODE) = 8" in p
        for p in problems
    )
    assert "launch with srun --nodes=2 --ntasks-per-node=4" in str(error)
    assert "or set nodes: 2 and procs_per_node: 3 in the job spec" in str(error)


def test_node_count_mismatch() -> None:
    error, problems = problems_of(rank(0, 0, 12, 4, 0, 3), environ=SPEC_2x4)
    assert "3 nodes (slurm: SLURM_STEP_NUM_NODES) but DIST_JOBS_NNODES=2" in problems
    assert len(problems) == 2  # the world size (12 != 8) as well


def test_procs_per_node_mismatch_with_explicit_expectations() -> None:
    _, problems = problems_of(rank(0, 0, 4, 2, 0, 2), expected_nodes=2, expected_procs_per_node=4, environ={})
    assert "2 processes on node 0 (slurm: SLURM_STEP_TASKS_PER_NODE) but expected_procs_per_node=4" in problems


def test_rank_outside_world() -> None:
    error, problems = problems_of(rank(8), environ={})
    assert problems == ["rank 8 (slurm: SLURM_PROCID) is outside world size 8 (slurm: SLURM_STEP_NUM_TASKS)"]
    assert "dist-jobs env" in (error.hint or "")


def test_local_rank_outside_local_world() -> None:
    _, problems = problems_of(rank(4, 4, node=1), environ={})
    assert problems == [
        "local rank 4 (slurm: SLURM_LOCALID) is outside local world size 4 (slurm: SLURM_STEP_TASKS_PER_NODE)"
    ]


def test_local_rank_beyond_procs_per_node() -> None:
    info = rank(5, 5, 12, 6, 0, 2)
    _, problems = problems_of(info, environ=SPEC_2x4)
    assert "local rank 5 (slurm: SLURM_LOCALID) but only 4 processes per node (DIST_JOBS_NPROC_PER_NODE)" in problems


def test_node_rank_outside() -> None:
    _, problems = problems_of(rank(4, 0, node=2), environ={})
    assert problems == ["node rank 2 (slurm: SLURM_NODEID) is outside 2 nodes (slurm: SLURM_STEP_NUM_NODES)"]
    _, problems = problems_of(rank(0, 0, 12, 4, 2, 3), expected_nodes=2, environ={})
    assert "node rank 2 (slurm: SLURM_NODEID) but only 2 nodes (expected_nodes)" in problems


def test_local_rank_maps_to_no_gpu() -> None:
    env = {**SPEC_2x4, "CUDA_VISIBLE_DEVICES": "0,1"}
    error, problems = problems_of(rank(3, 3), environ=env, device_count=2)
    assert problems == ["local rank 3 maps to GPU 3, but this process sees 2 GPUs (CUDA_VISIBLE_DEVICES '0,1')"]
    assert "--gpus-per-node=4" in (error.hint or "") and "procs_per_node: 2" in (error.hint or "")


def test_procs_per_device_shares_gpus() -> None:
    info = rank(3, 3)
    check(info, environ=SPEC_2x4, device_count=2, procs_per_device=2)
    assert device_index(info, {}, procs_per_device=2) == 1
    _, problems = problems_of(info, environ=SPEC_2x4, device_count=1, procs_per_device=2)
    assert problems[0].startswith("local rank 3 // procs_per_device=2 maps to GPU 1")
    with pytest.raises(UsageError):
        device_index(info, {}, procs_per_device=0)


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1", "127.0.1.1", "::1", "[::1]", "0.0.0.0"])
def test_loopback_master_in_multi_node_job(addr: str) -> None:
    error, problems = problems_of(rank(addr=addr), environ=SPEC_2x4)
    assert problems[0].startswith(f"MASTER_ADDR={addr} (slurm: MASTER_ADDR or the first host")
    assert "spans 2 nodes" in problems[0]
    assert "unset MASTER_ADDR" in (error.hint or "")
    check(rank(addr=addr), environ=SPEC_2x4, allow_loopback=True)
    check(rank(0, 0, 4, 4, 0, 1, addr=addr), environ={})  # one node: loopback is right


@pytest.mark.parametrize("addr", ["gpu07", "n1", "10.0.0.1", "fe80::1", "127x.example"])
def test_real_addresses_are_not_loopback(addr: str) -> None:
    assert not is_loopback(addr)


@pytest.mark.parametrize("port", [80, 0, 70000])
def test_port_out_of_range(port: int) -> None:
    _, problems = problems_of(rank(port=port), environ=SPEC_2x4)
    assert problems == [
        f"MASTER_PORT={port} (slurm: MASTER_PORT or derived from SLURM_JOB_ID/SLURM_STEP_ID) is outside 1024-65535"
    ]


def test_all_problems_are_reported_together() -> None:
    info = rank(9, 5, 6, 3, 2, 2, addr="localhost", port=22)
    error, problems = problems_of(info, environ=SPEC_2x4, device_count=4)
    assert len(problems) == 9
    assert str(error).count("\n    fix: ") == 9
    assert "9 problems" in error.message


def test_bad_expectation_variable_is_a_problem() -> None:
    _, problems = problems_of(rank(), environ={"DIST_JOBS_NNODES": "two", "DIST_JOBS_NPROC_PER_NODE": "4"})
    assert problems == ["DIST_JOBS_NNODES='two' is not a whole number >= 1"]


def test_explicit_expectations_win_over_environ() -> None:
    check(rank(), expected_nodes=2, expected_procs_per_node=4, environ={"DIST_JOBS_NNODES": "9"})


def test_fix_names_the_launcher() -> None:
    for source, words in [
        ("torchrun", "torchrun --nnodes=2 --nproc-per-node=4"),
        ("openmpi", "mpirun -np 8 --map-by ppr:4:node"),
        ("pytorchjob", "nprocPerNode: 1"),
        ("single", "srun or torchrun"),
    ]:
        info = rank(0, 0, 1, 1, 0, 1, addr="127.0.0.1", source=source)
        error, _ = problems_of(info, environ=SPEC_2x4)
        assert words in str(error), source


def test_resolved_slurm_launch_end_to_end() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_NUM_TASKS": "8",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        **SPEC_2x4,
    }
    check(resolve(env), environ=env, device_count=4)


def test_rendezvous_timeout() -> None:
    assert rendezvous_timeout({}) == 300.0
    assert rendezvous_timeout({"DIST_JOBS_RDZV_TIMEOUT": " 600 "}) == 600.0
    assert rendezvous_timeout({"DIST_JOBS_RDZV_TIMEOUT": "2.5"}) == 2.5
    for bad in ("abc", "0", "-5", "inf", "nan", "1e9"):
        with pytest.raises(RankError, match=f"DIST_JOBS_RDZV_TIMEOUT='{bad}'") as caught:
            rendezvous_timeout({"DIST_JOBS_RDZV_TIMEOUT": bad})
        assert "DIST_JOBS_RDZV_TIMEOUT=600" in (caught.value.hint or "")
