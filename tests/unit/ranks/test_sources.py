"""Rank sources: each launcher's real variables -> RankInfo, and the order they are tried in."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from dist_jobs.errors import RankError
from dist_jobs.ranks import SOURCES, RankInfo, resolve
from dist_jobs.ranks.ports import derive_port
from dist_jobs.ranks.report import as_json, as_table
from dist_jobs.ranks.slurm import SlurmSource, parse_tasks_per_node, tasks_on_node
from support.paths import REPO
from support.waiting import HUNG_S


def slurm_task(
    procid: int, localid: int, nodeid: int, ntasks: int, nnodes: int, tasks_per_node: str, **extra: str
) -> dict[str, str]:
    """What srun puts in one task's environment (names as seen on the 22.05 lab cluster)."""
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOBID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_NNODES": str(nnodes),
        "SLURM_STEP_NUM_NODES": str(nnodes),
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_JOB_NODELIST": "gpu[07-09]",
        "SLURM_STEP_NODELIST": "gpu[07-09]",
    }
    env.update(extra)
    return env


def info(
    rank: int, local_rank: int, world: int, local_world: int, node: int, nodes: int, addr: str, port: int, source: str
) -> RankInfo:
    return RankInfo(rank, local_rank, world, local_world, node, nodes, addr, port, source)


# --- SLURM ---------------------------------------------------------------------------------


@pytest.mark.parametrize("node", [0, 1])
@pytest.mark.parametrize("local", [0, 1, 2, 3])
def test_slurm_two_nodes_by_four_gpus(node: int, local: int) -> None:
    rank = node * 4 + local
    env = slurm_task(rank, local, node, 8, 2, "4(x2)")
    got = resolve(env)
    port = derive_port(4242, 0)
    assert got == info(rank, local, 8, 4, node, 2, "gpu07", port, "slurm")
    if node == 1:
        assert 4 <= got.rank <= 7 and got.local_rank == got.rank - 4


def test_slurm_three_nodes_four_procs_each() -> None:
    # 3 nodes with 8 GPUs each but procs_per_node 4: world size 12, not 24.
    ranks = [resolve(slurm_task(n * 4 + l, l, n, 12, 3, "4(x3)")) for n in range(3) for l in range(4)]
    assert [r.rank for r in ranks] == list(range(12))
    assert {(r.world_size, r.local_world_size, r.num_nodes) for r in ranks} == {(12, 4, 3)}
    assert [r.node_rank for r in ranks] == [0] * 4 + [1] * 4 + [2] * 4


def test_slurm_uneven_tasks_per_node() -> None:
    # 7 tasks as 2,2,2,1 (srun -n7 on 4 nodes); node 3 holds the single rank 6.
    tpn = "2(x3),1"
    got = [resolve(slurm_task(r, r % 2, r // 2, 7, 4, tpn)) for r in range(7)]
    assert [g.local_world_size for g in got] == [2, 2, 2, 2, 2, 2, 1]
    assert got[6].node_rank == 3 and got[6].local_rank == 0
    assert parse_tasks_per_node("X", "2(x3),1") == [(2, 3), (1, 1)]
    assert [tasks_on_node([(2, 3), (1, 1)], i) for i in range(5)] == [2, 2, 2, 1, None]


def test_slurm_master_and_port_overrides() -> None:
    env = slurm_task(1, 1, 0, 2, 1, "2", MASTER_ADDR="head.example", MASTER_PORT="29555")
    got = resolve(env)
    assert (got.master_addr, got.master_port) == ("head.example", 29555)


def test_slurm_port_depends_on_step_and_nodelist_fallback() -> None:
    env = slurm_task(0, 0, 0, 1, 1, "1", SLURM_STEP_ID="3", SLURM_STEPID="3")
    del env["SLURM_STEP_NODELIST"]
    got = resolve(env)
    assert got.master_port == derive_port(4242, 3)
    assert got.master_addr == "gpu07"  # from SLURM_JOB_NODELIST


def test_slurm_falls_back_to_job_tasks_per_node_and_even_split() -> None:
    env = slurm_task(5, 1, 2, 6, 3, "")
    del env["SLURM_STEP_TASKS_PER_NODE"]
    env["SLURM_TASKS_PER_NODE"] = "2(x3)"
    assert resolve(env).local_world_size == 2
    del env["SLURM_TASKS_PER_NODE"]
    assert resolve(env).local_world_size == 2  # 6 tasks / 3 nodes


def test_slurm_uneven_without_a_list_is_refused() -> None:
    env = slurm_task(0, 0, 0, 7, 4, "")
    del env["SLURM_STEP_TASKS_PER_NODE"], env["SLURM_TASKS_PER_NODE"]
    with pytest.raises(RankError, match="do not divide evenly") as caught:
        resolve(env)
    assert "--ntasks-per-node" in (caught.value.hint or "")


@pytest.mark.parametrize(
    ("tasks_per_node", "words"),
    [("2(x3", "cannot read item '2(x3'"), ("two", "cannot read"), ("2(x0)", "cannot read"), ("1", "lists fewer nodes")],
)
def test_slurm_bad_tasks_per_node(tasks_per_node: str, words: str) -> None:
    env = slurm_task(3, 1, 1, 4, 2, tasks_per_node)
    with pytest.raises(RankError, match=words.replace("(", r"\(")) as caught:
        resolve(env)
    assert "SLURM_STEP_TASKS_PER_NODE" in caught.value.message


@pytest.mark.parametrize("step", [None, "4294967294", "4294967291", "4294967292", "4294967290", "batch", "extern"])
def test_batch_script_and_extern_step_are_not_ranks(step: str | None) -> None:
    # The batch shell of a 2-node x 4-task job: SLURM_PROCID=0 is set there too.
    env = {
        "SLURM_JOB_ID": "99",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "8",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "4(x2)",
    }
    if step is not None:
        env["SLURM_STEP_ID"] = step
    assert not SlurmSource().detect(env)
    with pytest.raises(RankError, match="not a task started by srun") as caught:
        resolve(env)
    assert "srun" in (caught.value.hint or "")
    if step is not None:  # forcing the source does not make the batch step a rank either
        with pytest.raises(RankError, match="not a task started by srun"):
            resolve({**env, "DIST_JOBS_ENV": "slurm"})


def test_salloc_shell_is_not_a_rank() -> None:
    env = {
        "SLURM_JOB_ID": "100",
        "SLURM_JOBID": "100",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_TASKS_PER_NODE": "1(x2)",
    }
    assert not SlurmSource().detect(env)
    with pytest.raises(RankError, match="salloc"):
        resolve(env)


def test_one_task_batch_script_is_a_single_process() -> None:
    env = {"SLURM_JOB_ID": "101", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1"}
    assert resolve(env).source == "single"


def test_torchrun_inside_slurm_is_torchrun() -> None:
    # One srun task per node runs torchrun; its children carry both sets of variables.
    env = slurm_task(1, 0, 1, 2, 2, "1(x2)")
    env.update(
        {
            "TORCHELASTIC_RUN_ID": "4242",
            "RANK": "5",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "8",
            "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2",
            "ROLE_WORLD_SIZE": "8",
            "MASTER_ADDR": "gpu07",
            "MASTER_PORT": "39001",
        }
    )
    assert resolve(env) == info(5, 1, 8, 4, 1, 2, "gpu07", 39001, "torchrun")


def test_mpirun_inside_slurm_is_openmpi() -> None:
    # mpirun starts its daemons with srun (one per node); ranks inherit that step's SLURM_*.
    env = slurm_task(1, 0, 1, 2, 2, "1(x2)")
    env.update(
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "MASTER_ADDR": "gpu07",
            "MASTER_PORT": "29500",
        }
    )
    assert resolve(env) == info(3, 1, 4, 2, 1, 2, "gpu07", 29500, "openmpi")


def test_bad_slurm_number_names_the_variable() -> None:
    env = slurm_task(0, 0, 0, 2, 1, "2", SLURM_PROCID="zero")
    with pytest.raises(RankError, match=r"SLURM_PROCID='zero' is not a whole number >= 0"):
        resolve(env)
    env = slurm_task(0, 0, 0, 2, 1, "2", MASTER_PORT="70000")
    with pytest.raises(RankError, match=r"MASTER_PORT='70000' is not a whole number between 1 and 65535"):
        resolve(env)


def test_bad_nodelist_is_a_rank_error() -> None:
    env = slurm_task(0, 0, 0, 2, 1, "2", SLURM_STEP_NODELIST="gpu[3-1]")
    with pytest.raises(RankError, match="SLURM_STEP_NODELIST") as caught:
        resolve(env)
    assert "MASTER_ADDR" in (caught.value.hint or "")


# --- torchrun ------------------------------------------------------------------------------


def test_torchrun_child() -> None:
    env = {
        "TORCHELASTIC_RUN_ID": "none",
        "RANK": "2",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "4",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    assert resolve(env) == info(2, 0, 4, 2, 1, 2, "10.0.0.1", 29500, "torchrun")


def test_torchrun_missing_variables_are_named() -> None:
    with pytest.raises(RankError) as caught:
        resolve({"TORCHELASTIC_RUN_ID": "none", "RANK": "0"})
    message = caught.value.message
    for name in ("LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        assert name in message
    assert message.startswith("torchrun: LOCAL_RANK, ")  # RANK itself was set
    assert "torchrun --nnodes" in (caught.value.hint or "")


def test_hand_made_env_via_override() -> None:
    env = {
        "DIST_JOBS_ENV": "TorchRun",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "29400",
    }
    assert resolve(env) == info(3, 1, 4, 2, 1, 2, "h0", 29400, "torchrun")


# --- Kubeflow ------------------------------------------------------------------------------


def pytorchjob_pod(rank: int, pods: int, nproc: str | None) -> dict[str, str]:
    """What training-operator v1.9 appends to a Master/Worker pod (KUBERNETES_NOTES section 1)."""
    nproc_int = int(nproc) if nproc and nproc.isdigit() else 1
    env = {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": "23456",
        "PET_MASTER_PORT": "23456",
        "MASTER_ADDR": "llm-master-0",
        "PET_MASTER_ADDR": "llm-master-0",
        "WORLD_SIZE": str(pods * nproc_int),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NNODES": str(pods),
    }
    if nproc is not None:
        env["PET_NPROC_PER_NODE"] = nproc
    return env


@pytest.mark.parametrize("nproc", ["1", "auto", None])
def test_pytorchjob_python_per_pod(nproc: str | None) -> None:
    got = [resolve(pytorchjob_pod(r, 3, nproc)) for r in range(3)]
    assert got[2] == info(2, 0, 3, 1, 2, 3, "llm-master-0", 23456, "pytorchjob")
    assert [g.rank for g in got] == [0, 1, 2]


def test_pytorchjob_nproc_8_without_torchrun_is_refused() -> None:
    env = pytorchjob_pod(1, 2, "8")
    assert env["WORLD_SIZE"] == "16"
    with pytest.raises(RankError, match="PET_NPROC_PER_NODE='8'") as caught:
        resolve(env)
    assert "WORLD_SIZE=16" in caught.value.message
    assert "torchrun" in (caught.value.hint or "") and "nprocPerNode: 1" in (caught.value.hint or "")


def test_pytorchjob_under_torchrun_is_torchrun() -> None:
    env = pytorchjob_pod(1, 2, "8")
    env.update(
        {
            "TORCHELASTIC_RUN_ID": "none",
            "RANK": "9",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "16",
            "LOCAL_WORLD_SIZE": "8",
            "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2",
        }
    )
    assert resolve(env) == info(9, 1, 16, 8, 1, 2, "llm-master-0", 23456, "torchrun")


def test_worker_only_pytorchjob_has_no_rank() -> None:
    env = {"PYTHONUNBUFFERED": "1", "PET_NPROC_PER_NODE": "auto", "PET_NNODES": "2"}
    with pytest.raises(RankError, match="RANK, WORLD_SIZE") as caught:
        resolve(env)
    assert "Master replica" in (caught.value.hint or "")


def test_elastic_pytorchjob_needs_torchrun() -> None:
    env = {
        "PET_NPROC_PER_NODE": "1",
        "PET_NNODES": "1:4",
        "PET_RDZV_ENDPOINT": "job-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d",
    }
    with pytest.raises(RankError, match="elastic") as caught:
        resolve(env)
    assert "torchrun" in (caught.value.hint or "")


def test_trainer_v2_node() -> None:
    env = {
        "PET_NNODES": "3",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "2",
        "PET_MASTER_ADDR": "tj-node-0-0.tj",
        "PET_MASTER_PORT": "29500",
    }
    assert resolve(env) == info(2, 0, 3, 1, 2, 3, "tj-node-0-0.tj", 29500, "trainer")
    with pytest.raises(RankError, match="PET_NPROC_PER_NODE='4'") as caught:
        resolve({**env, "PET_NPROC_PER_NODE": "4"})
    assert "torchrun" in (caught.value.hint or "")


# --- Open MPI ------------------------------------------------------------------------------


def ompi(rank: int, size: int, local_rank: int, local_size: int, **extra: str) -> dict[str, str]:
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(local_size),
        "PMIX_RANK": str(rank),
        "PMIX_NAMESPACE": "prterun-h1-1234@1",
    }
    env.update(extra)
    return env


def test_openmpi_by_slot() -> None:
    got = resolve(ompi(3, 4, 1, 2, MASTER_ADDR="h1"))
    assert got == info(3, 1, 4, 2, 1, 2, "h1", got.master_port, "openmpi")
    # Without MASTER_PORT every rank derives the same port from the shared job id.
    assert resolve(ompi(0, 4, 0, 2, MASTER_ADDR="h1")).master_port == got.master_port


def test_openmpi_needs_master_addr() -> None:
    with pytest.raises(RankError, match="MASTER_ADDR") as caught:
        resolve(ompi(0, 4, 0, 2))
    assert "mpirun" in (caught.value.hint or "") and "-x MASTER_ADDR" in (caught.value.hint or "")


def test_openmpi_round_robin_mapping_is_refused() -> None:
    # --map-by node: rank 1 is local rank 0 on the second node.
    with pytest.raises(RankError, match="not placed by slot"):
        resolve(ompi(1, 4, 0, 2, MASTER_ADDR="h1"))


# --- single, override, result type ---------------------------------------------------------


def test_single_process() -> None:
    got = resolve({})
    assert (got.rank, got.world_size, got.num_nodes, got.master_addr, got.source) == (0, 1, 1, "127.0.0.1", "single")
    assert 10000 <= got.master_port <= 65535
    forced = resolve({"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "12345"})
    assert (forced.master_addr, forced.master_port) == ("10.1.1.1", 12345)


def test_unexplained_world_size_is_refused_unless_forced() -> None:
    with pytest.raises(RankError, match="WORLD_SIZE='4'") as caught:
        resolve({"WORLD_SIZE": "4", "RANK": "1"})
    assert "DIST_JOBS_ENV=torchrun" in (caught.value.hint or "")
    assert resolve({"WORLD_SIZE": "4", "DIST_JOBS_ENV": "single"}).world_size == 1


def test_override_with_missing_variables_names_them() -> None:
    with pytest.raises(RankError) as caught:
        resolve({"DIST_JOBS_ENV": "slurm", "SLURM_JOB_ID": "5"})
    message = caught.value.message
    assert message.startswith("DIST_JOBS_ENV=slurm but ")
    for name in ("SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NUM_TASKS"):
        assert name in message
    assert "SLURM_JOB_ID" not in message


def test_override_wins_over_detection() -> None:
    env = slurm_task(0, 0, 0, 1, 1, "1", TORCHELASTIC_RUN_ID="x", DIST_JOBS_ENV="slurm")
    assert resolve(env).source == "slurm"


def test_unknown_override() -> None:
    with pytest.raises(RankError, match="'lsf' is not a known rank source") as caught:
        resolve({"DIST_JOBS_ENV": "lsf"})
    assert "torchrun, slurm, pytorchjob, trainer, openmpi, single" in (caught.value.hint or "")


def test_source_order() -> None:
    assert list(SOURCES) == ["torchrun", "slurm", "pytorchjob", "trainer", "openmpi", "single"]


def test_rankinfo_is_frozen_and_exports_env() -> None:
    got = info(5, 1, 8, 4, 1, 2, "gpu07", 29500, "slurm")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.rank = 1  # type: ignore[misc]
    target: dict[str, str] = {"OTHER": "kept"}
    exported = got.export(target)
    assert exported == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "NODE_RANK": "1",
        "MASTER_ADDR": "gpu07",
        "MASTER_PORT": "29500",
    }
    assert target == {"OTHER": "kept", **exported}


def test_export_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    got = info(0, 0, 2, 2, 0, 1, "h", 29500, "slurm")
    for name in got.export({}):  # monkeypatch puts back what each variable was before the test
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "999")
    got.export()
    assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "2"


def test_report_table_and_json() -> None:
    got = info(5, 1, 8, 4, 1, 2, "gpu07", 29500, "slurm")
    table = as_table(got)
    assert "master_addr       gpu07" in table and "MASTER_PORT       29500" in table
    data = json.loads(as_json(got))
    assert data["rank"] == 5 and data["source"] == "slurm" and data["env"]["GROUP_RANK"] == "1"


def test_ranks_import_no_torch() -> None:
    probe = (
        "import sys, dist_jobs.ranks, dist_jobs.ranks.selfcheck, dist_jobs.ranks.report;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'msgspec', 'numpy', 'kubernetes', 'jinja2', 'yaml')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=HUNG_S, check=True
    ).stdout.strip()
    assert out == "[]"
