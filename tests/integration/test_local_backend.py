"""`dist-jobs run --backend local`: cluster-shaped environments, real processes, clean teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

from dist_jobs.backends.local import plan
from dist_jobs.ranks import resolve
from dist_jobs.spec.load import load_spec
from support.paths import PYTHON

ALLREDUCE = textwrap.dedent("""
    import json, os, socket, datetime
    import torch, torch.distributed as dist
    from dist_jobs.ranks import resolve
    from dist_jobs.ranks.selfcheck import check
    info = resolve()
    check(info)
    info.export()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.tensor([float(info.rank)])
    dist.all_reduce(t)
    print(json.dumps({"rank": info.rank, "local_rank": info.local_rank, "node_rank": info.node_rank,
                      "world": dist.get_world_size(), "sum": t.item(), "source": info.source}), flush=True)
    dist.destroy_process_group()
""")


def test_plan_seed_arithmetic(tmp_path) -> None:
    spec = load_spec(data={"name": "seed", "nodes": 2, "gpus_per_node": 4})
    procs = plan(spec, tmp_path, 12345, "77", use_gpus=False)
    infos = [resolve(p.env) for p in procs]
    assert [i.rank for i in infos] == list(range(8)) and {i.world_size for i in infos} == {8}
    node1 = [i for i in infos if i.node_rank == 1]
    assert [i.rank for i in node1] == [4, 5, 6, 7] and [i.local_rank for i in node1] == [0, 1, 2, 3]
    assert {i.master_addr for i in infos} == {"127.0.0.1"} and {i.source for i in infos} == {"slurm"}
    assert all(p.env["CUDA_VISIBLE_DEVICES"] == "" for p in procs)


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "dist_jobs", "run", "--backend", "local", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _records(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("[") and "{" in line:  # "[rank 3] {...}" or "[node 1] [default0]:{...}"
            out.append(json.loads(line[line.index("{") :]))
    return out


def test_real_allreduce_srun_mode(tmp_path) -> None:
    (tmp_path / "ar.py").write_text(ALLREDUCE)
    proc = _run(["--nodes", "2", "--procs-per-node", "2", "--", PYTHON, "ar.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = sorted(_records(proc.stdout), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1, 2, 3]
    assert all(r["sum"] == 6.0 and r["world"] == 4 and r["source"] == "slurm" for r in recs)
    assert [(r["node_rank"], r["local_rank"]) for r in recs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert "[rank 3] {" in proc.stdout  # every line carries its rank


def test_real_allreduce_torchrun_mode(tmp_path) -> None:
    (tmp_path / "ar.py").write_text(ALLREDUCE)
    proc = _run(
        ["--nodes", "2", "--procs-per-node", "2", "--launcher", "torchrun", "--", "python3", "ar.py"],
        tmp_path,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = _records(proc.stdout)
    assert sorted(r["rank"] for r in recs) == [0, 1, 2, 3]
    assert all(r["sum"] == 6.0 and r["source"] == "torchrun" for r in recs)


def test_torchrun_mode_keeps_the_interpreter_and_its_flags(tmp_path) -> None:
    """`-- python3 -u -c CODE` under torchrun runs exactly that (torchrun once got `-u -c CODE`)."""
    code = "import os, sys; print('flags', sys.stdout.write_through, sys.flags.optimize, os.environ['RANK'])"
    proc = _run(["--procs-per-node", "1", "--launcher", "torchrun", "--", "python3", "-u", "-O", "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "flags True 1 0" in proc.stdout


def test_a_checkpoint_dir_that_is_a_file_is_bad_input(tmp_path) -> None:
    (tmp_path / "ckfile").write_text("")
    proc = _run(["--procs-per-node", "1", "--checkpoint-dir", "ckfile", "--", PYTHON, "-c", "pass"], tmp_path)
    assert proc.returncode == 2 and "checkpoint_dir" in proc.stderr and "Traceback" not in proc.stderr
    env = {**os.environ, "DIST_JOBS_ENV": "single"}
    argv = [PYTHON, "-m", "dist_jobs.train", "--checkpoint-dir", "ckfile", "--max-steps", "1", "--fake-samples", "64"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2 and "not a folder" in proc.stderr and "Traceback" not in proc.stderr


def test_gpu_request_falls_back_to_cpu_with_notice(tmp_path) -> None:
    proc = _run(
        [
            "--nodes",
            "1",
            "--gpus",
            "2",
            "--",
            PYTHON,
            "-c",
            "import os; print('cvd=' + repr(os.environ['CUDA_VISIBLE_DEVICES']))",
        ],
        tmp_path,
    )
    assert proc.returncode == 0
    if "this machine has 0" in proc.stdout:
        assert proc.stdout.count("cvd=''") == 2


def test_first_failure_tears_down_and_returns_its_code(tmp_path) -> None:
    code = "import os, sys, time; r = int(os.environ['SLURM_PROCID']); time.sleep(0.3 if r == 2 else 600); sys.exit(7)"
    start = time.monotonic()
    proc = _run(["--nodes", "2", "--procs-per-node", "2", "--", PYTHON, "-c", code], tmp_path)
    assert proc.returncode == 7
    assert time.monotonic() - start < 30  # the sleepers were torn down, not waited for


def test_ctrl_c_stops_everything(tmp_path) -> None:
    marker = f"djtest-{uuid.uuid4().hex}"
    code = f"import time; print('up', flush=True); time.sleep(600)  # {marker}"
    proc = subprocess.Popen(
        [PYTHON, "-m", "dist_jobs", "run", "--nodes", "2", "--procs-per-node", "2", "--", PYTHON, "-c", code],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    seen = 0
    assert proc.stdout is not None
    while seen < 4:
        seen += "up" in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes left running: {left}"


def test_dry_run_plan_names_every_process(tmp_path) -> None:
    from dist_jobs.backends.local import LocalBackend

    spec = load_spec(data={"name": "x", "nodes": 2, "procs_per_node": 2})
    payload = LocalBackend(workdir=tmp_path).prepare(spec).payload
    assert payload.count("# rank ") == 4 and "SLURM_PROCID=3" in payload
