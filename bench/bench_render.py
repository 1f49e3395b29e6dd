"""Median wall time of `dist-jobs render` against `python -c "import jinja2, yaml"`, same run.

    python bench/bench_render.py [--runs 21]

`dist-jobs` is the console script users run (not `python -m dist_jobs`, which adds runpy's ~3 ms).

All are started as fresh processes, interleaved, so machine load hits them alike. Budget (issue
25): each render's median wall time at most 2x the baseline's (torchx's dry run, the nearest peer,
is about 4x its baseline), 1.5x for a Kubernetes manifest of a spec with 200 env variables (every
one emitted twice, for the Master and the Worker template), which measures YAML emission rather
than start-up. The exit code is 1 when a render is over budget.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# Warm .pyc files are part of a user's start-up: a session that sets PYTHONDONTWRITEBYTECODE would
# recompile dist-jobs (and only dist-jobs: the baseline's packages ship their .pyc) on every run.
# PYTHONPATH: this checkout, whichever one the venv's console script was installed from.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
ENV["PYTHONPATH"] = str(REPO)


def dist_jobs() -> list[str]:
    """The console script next to this interpreter, as users run it; else `python -m dist_jobs`."""
    script = Path(sys.executable).parent / "dist-jobs"
    return [sys.executable, str(script)] if script.is_file() else [sys.executable, "-m", "dist_jobs"]


def wall(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child). On a machine shared with other work the wall
    ratio drifts toward 1 (waiting for a core adds to both sides); the CPU ratio does not."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=ENV)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def env_spec(folder: Path, count: int = 200) -> Path:
    """The k8s example with `count` env variables: plain words, paths, and values YAML must quote."""
    values = ["plain", "/opt/data/set-{i}", "a value with: colon #{i}", "y", "0{i}", "line one\nline two", "é{i}"]
    env = {f"VAR_{i:03d}": values[i % len(values)].format(i=i) for i in range(count)}
    text = (REPO / "k8s/examples/resnet-2x4.yaml").read_text() + "\nenv:\n"
    text += "".join(f"  {name}: {json.dumps(value)}\n" for name, value in env.items())
    path = folder / "env200.yaml"
    path.write_text(text)
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-render-"))
    baseline = [sys.executable, "-c", "import jinja2, yaml"]
    cases = {
        "render slurm": [*dist_jobs(), "render", "--backend", "slurm", str(REPO / "slurm/examples/resnet-2x4.yaml")],
        "render k8s": [*dist_jobs(), "render", "--backend", "k8s", str(REPO / "k8s/examples/resnet-2x4.yaml")],
        "render k8s, 200 env": [*dist_jobs(), "render", "--backend", "k8s", str(env_spec(folder))],
    }
    for argv in [baseline, *cases.values()]:  # warm the page cache and .pyc files
        wall(argv)
    times: dict[str, list[tuple[float, float]]] = {"baseline": [], **{k: [] for k in cases}}
    for _ in range(args.runs):
        times["baseline"].append(wall(baseline))
        for name, argv in cases.items():
            times[name].append(wall(argv))
    base = [statistics.median(t[i] for t in times["baseline"]) for i in (0, 1)]
    print(
        f"baseline `python -c 'import jinja2, yaml'`: median {base[0] * 1000:.1f} ms wall, "
        f"{base[1] * 1000:.1f} ms CPU over {args.runs} runs"
    )
    over = []
    for name in cases:
        med = [statistics.median(t[i] for t in times[name]) for i in (0, 1)]
        budget = 1.5 if "env" in name else 2.0
        verdict = "ok" if med[0] <= budget * base[0] else "OVER"
        over += [name] if verdict == "OVER" else []
        print(
            f"dist-jobs {name}: median {med[0] * 1000:.1f} ms wall, ratio {med[0] / base[0]:.2f}x "
            f"(budget <= {budget}x: {verdict}); {med[1] * 1000:.1f} ms CPU, ratio {med[1] / base[1]:.2f}x"
        )
    if over:
        sys.exit(f"over budget: {', '.join(over)}")


if __name__ == "__main__":
    main()
