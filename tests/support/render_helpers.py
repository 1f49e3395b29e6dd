"""Run the rendered job scripts: the sbatch script with stub `srun`/`scontrol`/`sinfo` that record
what they were given (sinfo and scontrol print nothing), and a pod's entrypoint as its container
runs it."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dist_jobs.render.k8s import container_command
from dist_jobs.spec.load import load_spec
from support import kubelet
from support.paths import REPO, venv_bin
from support.waiting import HUNG_S

STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_OUT"], "a") as f:
    record = {{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "env": dict(os.environ)}}
    f.write(json.dumps(record) + "\\n")
sys.exit(int(os.environ.get("STUB_RC", "0")))
"""


# srun as the batch script meets it: a node check (dist_jobs.backends.slurm.nodecheck, one task per
# node) answers "NODE<TAB>ok" for each node of STUB_NODES (`|` between the answers of successive
# checks, the last repeats), or what STUB_UNFIT ("NODE:why") says of one; each job step exits
# with the next of STUB_RCS (the last repeats) and writes the matching `|`-separated part of
# STUB_ERRS to stderr, as srun reports its tasks.
SRUN_STUB = """#!{python}
import json, os, sys
with open(os.environ["STUB_OUT"], "a") as f:
    record = {{"prog": "srun", "argv": sys.argv[1:], "env": dict(os.environ)}}
    f.write(json.dumps(record) + "\\n")
if "dist_jobs.backends.slurm.nodecheck" in sys.argv:
    checks = os.environ["STUB_OUT"] + ".checks"
    n = int(open(checks).read()) if os.path.exists(checks) else 0
    open(checks, "w").write(str(n + 1))
    answers = os.environ.get("STUB_NODES", "").split("|")
    unfit = dict([os.environ["STUB_UNFIT"].split(":", 1)]) if os.environ.get("STUB_UNFIT") else {{}}
    for node in filter(None, answers[min(n, len(answers) - 1)].split(",")):
        print(f"{{node}}\\t{{unfit.get(node, 'ok')}}")
    sys.exit(0)
counter = os.environ["STUB_OUT"] + ".steps"
n = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
rcs = os.environ.get("STUB_RCS") or os.environ.get("STUB_RC", "0")
rcs, errs = rcs.split(","), os.environ.get("STUB_ERRS", "").split("|")
if errs[min(n, len(errs) - 1)]:
    sys.stderr.write(errs[min(n, len(errs) - 1)] + "\\n")
sys.exit(int(rcs[min(n, len(rcs) - 1)]))
"""


def make_stubs(folder: Path, python: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("srun", "scontrol", "sinfo", "torchrun"):
        path = folder / name
        path.write_text((SRUN_STUB if name == "srun" else STUB).format(python=python))
        path.chmod(0o755)
    return folder


def step_calls(calls: list[dict]) -> list[dict]:
    """The job steps among the stub calls (srun, the node checks left out)."""
    return [c for c in calls if c["prog"] == "srun" and "dist_jobs.backends.slurm.nodecheck" not in c["argv"]]


def run_script(
    script: str, workdir: Path, stubs: Path, extra_env: dict[str, str] | None = None, rc: int = 0
) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """Run the batch script as SLURM would on the head node of a 2-node job."""
    out = workdir / "stub-calls.jsonl"
    out.unlink(missing_ok=True)
    Path(f"{out}.steps").unlink(missing_ok=True)
    Path(f"{out}.checks").unlink(missing_ok=True)
    (workdir / "job.sbatch").write_text(script)
    env = {
        "PATH": f"{stubs}:{venv_bin()}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),  # the script's `python3 -m dist_jobs...` runs this checkout
        "HOME": str(workdir),
        "STUB_OUT": str(out),
        "STUB_RC": str(rc),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu[007-008]",
        "SLURM_NNODES": "2",
        "STUB_NODES": "gpu007,gpu008",  # both nodes answer
        **(extra_env or {}),
    }
    proc = subprocess.run(["bash", "job.sbatch"], cwd=workdir, env=env, capture_output=True, text=True, timeout=HUNG_S)
    calls = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    # Left out: the step watcher's looks at the job's steps, as many as its timing gives
    # (dist_jobs.backends.slurm.stepwatch, tested on its own).
    calls = [c for c in calls if not (c["prog"] == "scontrol" and c["argv"][:3] == ["-o", "show", "step"])]
    assert "Warning:" not in proc.stderr, proc.stderr  # the job's log shows no tool's Python warning
    return proc, calls


def run_pod_entrypoint(
    spec: dict[str, Any], program: str, shared: Path, env: Mapping[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The pod entrypoint of the k8s spec `spec` as its container runs it (the kubelet's `$$`
    undone), with `program` (sh code) in place of the trainer: the run's checkpoint folder is
    `shared`, and `env` adds to (or overrides) what the pod is given."""
    command = [kubelet.expand(arg, {}) for arg in container_command(load_spec(data=spec))]
    assert command[:2] == ["/bin/sh", "-c"]
    environ = {
        "PATH": f"{venv_bin()}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
        "DIST_JOBS_CHECKPOINT_DIR": str(shared),
        "DIST_JOBS_RUN": spec["name"],
        "DIST_JOBS_MAX_REQUEUES": "3",
        **env,
    }
    argv = [*command[:4], "sh", "-c", program]
    proc = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=HUNG_S, cwd=cwd)
    assert "Warning:" not in proc.stderr, proc.stderr  # the pod's log shows no tool's Python warning
    return proc


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "DIST_JOBS_"))}
