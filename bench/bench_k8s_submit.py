"""`dist-jobs submit --backend k8s job.yaml` vs `kubectl create -f` of the same rendered manifest.

    .venv/bin/python bench/bench_k8s_submit.py [--runs 9] [--repo OTHER_CHECKOUT]

Needs the real apiserver tier (bash k8s/apiserver/up.sh; or DIST_JOBS_KUBECONFIG) and a kubectl
(the one up.sh caches, else the one on PATH).

Measured (wall clock of this process, `time.perf_counter()`, from just before the command is
started to its exit): each run creates one PyTorchJob of k8s/examples/resnet-2x4.yaml in the
`default` namespace under a fresh name, with
- baseline: `kubectl --kubeconfig K create -f job.yaml`, the manifest `dist-jobs render` made
  (kubectl validates it against the server's OpenAPI schema first, as it does by default);
- dist-jobs: `python -m dist_jobs submit --backend k8s --kubeconfig K job-spec.yaml --name N
  --namespace default`: start-up, spec load and Kubernetes rules, render, kubeconfig, the create
  (fieldValidation=Strict) over a new TLS connection.
Runs alternate (baseline, dist-jobs, baseline, ...) so both see the same machine load; every
job is deleted before the next run (not timed). Medians are compared. `--repo` times the
dist-jobs of another checkout (e.g. `git archive COMMIT | tar -x -C DIR` for a before/after).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SPEC = REPO / "k8s" / "examples" / "resnet-2x4.yaml"


def kubeconfig() -> Path:
    explicit = os.environ.get("DIST_JOBS_KUBECONFIG")
    if explicit:
        return Path(explicit)
    state = Path("/run/dist-jobs-apiserver") if os.access("/run", os.W_OK) else None
    state = Path(os.environ.get("DIST_JOBS_APISERVER_STATE") or state or f"/tmp/dist-jobs-apiserver-{os.getuid()}")
    return state / "kubeconfig"


def kubectl() -> str:
    cache = Path(os.environ.get("DIST_JOBS_CACHE", Path.home() / ".cache" / "dist-jobs"))
    cached = cache / "kube-apiserver-v1.20.2" / "bin" / "kubectl"
    found = str(cached) if cached.exists() else shutil.which("kubectl")
    if not found:
        sys.exit("no kubectl: bash k8s/apiserver/up.sh caches one")
    return found


def timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{argv[:3]} failed: {proc.stderr[-2000:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose dist-jobs is timed")
    args = parser.parse_args()
    config, kc = kubeconfig(), kubectl()
    env = {**os.environ, "PYTHONPATH": str(args.repo.resolve())}
    dj = [sys.executable, "-m", "dist_jobs"]
    times: dict[str, list[float]] = {"kubectl": [], "dist-jobs": []}
    with tempfile.TemporaryDirectory(prefix="bench-k8s-") as tmp:
        for run in range(args.runs):
            names = {tool: f"bench-{tool[0]}-{uuid.uuid4().hex[:8]}" for tool in times}
            flags = ["--namespace", "default"]
            manifest = Path(tmp) / f"{run}.yaml"
            rendered = subprocess.run(
                [*dj, "render", "--backend", "k8s", str(SPEC), "--name", names["kubectl"], *flags],
                capture_output=True,
                text=True,
                env=env,
                cwd=tmp,  # not the checkout: `python -m` would import the dist_jobs of the current directory
                check=True,
            )
            manifest.write_text(rendered.stdout)
            times["kubectl"].append(timed([kc, "--kubeconfig", str(config), "create", "-f", str(manifest)], env, tmp))
            submit = [*dj, "submit", "--backend", "k8s", "--kubeconfig", str(config), str(SPEC)]
            times["dist-jobs"].append(timed([*submit, "--name", names["dist-jobs"], *flags], env, tmp))
            for name in names.values():
                subprocess.run(
                    [kc, "--kubeconfig", str(config), "delete", "pytorchjob", name, "--wait=false"],
                    capture_output=True,
                    check=True,
                )
    medians = {tool: statistics.median(values) for tool, values in times.items()}
    result = {
        "runs": args.runs,
        "repo": str(args.repo),
        "median_s": {k: round(v, 3) for k, v in medians.items()},
        "all_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "ratio": round(medians["dist-jobs"] / medians["kubectl"], 2),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
