"""An unmodified DDP script (tests/support/envscript.py: `init_process_group("gloo")`, LOCAL_RANK)
gets torch's env:// contract from every launch mode dist-jobs has: the local backend (srun and
torchrun emulation) and Kubeflow pods played by the operator harness (one python per pod through
the launcher, and torchrun per pod). The real SLURM cluster's modes are in test_slurm_cluster.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.render import render
from dist_jobs.spec import load_spec
from support.operator_harness import Operator
from support.paths import PYTHON, TESTS
from support.tiers import require_module, requires
from support.waiting import HUNG_S

ENV_SCRIPT = TESTS / "support" / "envscript.py"


def results(text: str) -> list[dict[str, Any]]:
    found = [json.loads(line[line.index("RESULT ") + 7 :]) for line in text.splitlines() if "RESULT " in line]
    return sorted(found, key=lambda r: r["rank"])


def check_world(got: list[dict[str, Any]], nodes: int, procs: int) -> None:
    world = nodes * procs
    assert [r["rank"] for r in got] == list(range(world)), got
    for r in got:
        node = r["rank"] // procs
        assert (r["world"], r["local_rank"], r["local_world_size"]) == (world, r["rank"] % procs, str(procs)), r
        # torchrun names the node rank GROUP_RANK only; dist-jobs' launcher sets both names.
        assert r["group_rank"] == str(node) and r["node_rank"] in (None, str(node)), r
        assert r["sum"] == sum(range(world)), r


def run_locally(cwd: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`dist-jobs run --backend local OPTIONS -- python envscript.py`, run in `cwd`."""
    argv = [PYTHON, "-m", "dist_jobs", "run", "--backend", "local", *options, "--", "python", str(ENV_SCRIPT)]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=HUNG_S)


@requires("torch")
@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_local_backend_gives_an_unmodified_script_its_ranks(tmp_path: Path, launcher: str) -> None:
    proc = run_locally(tmp_path, "--nodes", "2", "--procs-per-node", "2", "--launcher", launcher)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = results(proc.stdout)
    check_world(got, nodes=2, procs=2)
    # 4 processes share this host's CPUs: none may take a thread per core.
    assert {r["omp_num_threads"] for r in got} == {"1"}


@requires("torch")
def test_users_thread_setting_wins(tmp_path: Path) -> None:
    proc = run_locally(tmp_path, "--nodes", "1", "--procs-per-node", "2", "--env", "OMP_NUM_THREADS=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {r["omp_num_threads"] for r in results(proc.stdout)} == {"3"}


def _job(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    data = {
        "name": "env-pods",
        "nodes": 2,
        "procs_per_node": 1,
        "image": "local/dist-jobs:test",
        "command": ["python3", str(ENV_SCRIPT)],
        "env": {"DIST_JOBS_RDZV_TIMEOUT": "60"},
        "k8s": {"pvc": "shared", "mount_path": str(tmp_path / "shared")},
        **fields,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    return yaml.safe_load(render(load_spec(path), "k8s"))


@requires("pods")
@pytest.mark.timeout(240)
@pytest.mark.parametrize(("launch", "procs"), [("direct", 1), ("torchrun", 2)])
def test_pytorchjob_pods_give_an_unmodified_script_its_ranks(tmp_path: Path, launch: str, procs: int) -> None:
    job = _job(
        tmp_path, procs_per_node=procs, k8s={"pvc": "shared", "mount_path": str(tmp_path / "shared"), "launch": launch}
    )
    (tmp_path / "logs").mkdir()
    with Operator(job, tmp_path / "logs") as operator:
        assert operator.finish(timeout=200) == "Succeeded", operator.attempts[-1].text()[-3000:]
    got = results("\n".join(a.text() for a in operator.attempts))
    check_world(got, nodes=2, procs=procs)
    assert {r["master_addr"] for r in got} == {"env-pods-master-0"}
    assert {r["host"] for r in got} == {"env-pods-master-0", "env-pods-worker-0"}


@requires("torch")
def test_call_local_runs_your_function_on_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dist_jobs
    from support.envscript import report

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))  # the children unpickle `support.envscript.report`
    spec = dist_jobs.load_spec(data={"nodes": 2, "procs_per_node": 2})
    got = dist_jobs.call_local(spec, report)
    assert (got["rank"], got["world"], got["sum"], got["local_world_size"]) == (0, 4, 6.0, "2")
    assert not list(tmp_path.glob(".dist-jobs-call-*"))  # nothing left behind


def _preemptible(checkpoints: str, stop_after: int) -> dict[str, float]:
    """A notebook's training function on fit(): the first call is preempted after `stop_after` steps."""
    import os
    import signal

    from dist_jobs.spec.train import TrainConfig
    from dist_jobs.train.loop import fit
    from support.regression_job import Points, Regressor, mse

    class Preempt:  # a user object in fit's state: sends the preemption signal once, mid-run
        def __init__(self) -> None:
            self.calls = 0

        def state_dict(self) -> dict[str, int]:
            self.calls += 1
            if self.calls == stop_after and os.environ["RANK"] == "0" and not os.path.exists(checkpoints + "/once"):
                open(checkpoints + "/once", "w").close()
                os.kill(os.getpid(), signal.SIGTERM)
            return {}

        def load_state_dict(self, state: dict[str, int]) -> None:
            pass

    config = TrainConfig(
        batch_size=8,
        epochs=2,
        checkpoint_dir=checkpoints,
        run_name="nb",
        progress=False,
        checkpoint_every_steps=1,
        device="cpu",
        eval_every_epoch=False,
    )
    return fit(config, Regressor(), Points(64), loss=mse, state={"tick": Preempt()})


@requires("torch")
def test_call_local_preempted_function_resumes_when_called_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dist_jobs
    from dist_jobs.constants import REQUEUE_EXIT_CODE

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    # A notebook's functions live in __main__, which cloudpickle sends by value: do the same here.
    cloudpickle = require_module("cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spec = dist_jobs.load_spec(data={"nodes": 1, "procs_per_node": 2})
    ckpt = str(tmp_path / "ckpt")
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(dist_jobs.Preempted) as caught:  # sys.exit(caught.value.exit_code) requeues a script
        dist_jobs.call_local(spec, _preemptible, ckpt, 2)
    assert caught.value.exit_code == REQUEUE_EXIT_CODE and "preempted and checkpointed" in caught.value.message
    metrics = dist_jobs.call_local(spec, _preemptible, ckpt, 2)
    assert metrics["step"] == 8  # 64 samples / 2 ranks / batch 8 = 4 steps an epoch, 2 epochs


def _exits(code: int) -> None:
    raise SystemExit(code)


def test_call_local_keeps_the_exit_code_of_a_failed_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dist_jobs

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    cloudpickle = require_module("cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.raises(dist_jobs.DistJobsError) as caught:
        dist_jobs.call_local(dist_jobs.load_spec(data={"nodes": 1, "procs_per_node": 1}), _exits, 7)
    assert caught.value.exit_code == 7 and not isinstance(caught.value, dist_jobs.Preempted)
