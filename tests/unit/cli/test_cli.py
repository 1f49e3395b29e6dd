"""The CLI surface: version, schema, -o, the command after `--`, stdout for piping."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from dist_jobs import __version__
from support.paths import PYTHON, REPO
from support.tiers import require_module
from support.waiting import HUNG_S, eventually


def dj(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=cwd, timeout=HUNG_S)


def test_version() -> None:
    assert dj("--version").stdout.strip() == f"dist-jobs {__version__}"


def test_schema_is_json_schema_with_fields() -> None:
    schema = json.loads(dj("schema").stdout)
    assert {"name", "nodes", "gpus_per_node", "slurm", "k8s", "train"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_schema_accepts_every_example_and_rejects_what_load_spec_rejects() -> None:
    """What an editor checks against `dist-jobs schema` agrees with what dist-jobs accepts."""
    jsonschema = require_module("jsonschema")
    validator = jsonschema.Draft202012Validator(json.loads(dj("schema").stdout))
    examples = sorted((REPO / "slurm/examples").glob("*.yaml")) + [
        p for p in sorted((REPO / "k8s/examples").glob("*.yaml")) if p.name.count(".") == 1
    ]
    assert len(examples) >= 6
    for path in examples:
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == [], path
    bad = {
        "nodes": 0,
        "memory": "64G\n",
        "slurm": {"partiton": "x"},
        "env": {"1BAD": "v"},
        "k8s": {"shm_size": "lots"},
        "train": {"amp": "fp32"},
    }
    paths = sorted("/".join(map(str, e.absolute_path)) or e.message for e in validator.iter_errors(bad))
    assert len(paths) == 6, paths


def test_command_after_double_dash_replaces_default(tmp_path) -> None:
    proc = dj(
        "render",
        "--backend",
        "k8s",
        "--image",
        "i:1",
        "--nodes",
        "2",
        "--gpus",
        "4",
        "--",
        "python",
        "train.py",
        "--lr",
        "0.1",
    )
    assert proc.returncode == 0, proc.stderr
    doc = next(yaml.safe_load_all(proc.stdout))
    cmd = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[4:] == [
        "python3",
        "-m",
        "dist_jobs.train.torchrun",
        "--nproc-per-node=4",
        "--no-python",
        "python",
        "train.py",
        "--lr",
        "0.1",
    ]


def test_output_file_and_stdout_identical(tmp_path) -> None:
    example = str(REPO / "slurm/examples/cpu-only.yaml")
    out = tmp_path / "job.sbatch"
    assert dj("render", "--backend", "slurm", example, "-o", str(out)).returncode == 0
    assert out.read_text() == dj("render", "--backend", "slurm", example).stdout


def test_k8s_needs_image_with_hint() -> None:
    proc = dj("render", "--backend", "k8s", "--procs-per-node", "1")
    assert proc.returncode == 2 and "image" in proc.stderr and "--image" in proc.stderr


def test_set_and_env_forms() -> None:
    proc = dj("render", "--backend", "slurm", "--procs-per-node", "1", "--env", "NOEQUALS")
    assert proc.returncode == 2 and "KEY=VALUE" in proc.stderr
    proc = dj("render", "--backend", "slurm", "--procs-per-node", "1", "--set", "train.epochs=5")
    assert proc.returncode == 0 and "--epochs=5" in proc.stdout


def _subcommands() -> dict[str, object]:
    import argparse

    from dist_jobs.cli import _parser

    parser = _parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


@pytest.mark.parametrize("verb", sorted(_subcommands()))
def test_every_subcommands_help_works_and_every_flag_is_explained(verb: str) -> None:
    proc = dj(verb, "--help")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith(f"usage: dist-jobs {verb}")
    parser = _subcommands()[verb]
    silent = [a.option_strings or [a.dest] for a in parser._actions if not a.help]  # type: ignore[attr-defined]
    assert not silent, f"`dist-jobs {verb}` has arguments without help: {silent}"


def _render_to(target: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return dj("render", "--backend", "slurm", "--procs-per-node", "1", "-o", target, cwd=cwd)


def test_output_writes_through_a_symlink(tmp_path) -> None:
    (tmp_path / "real.sbatch").write_text("old\n")
    (tmp_path / "link.sbatch").symlink_to("real.sbatch")
    assert _render_to(str(tmp_path / "link.sbatch")).returncode == 0
    assert (tmp_path / "link.sbatch").is_symlink()  # once replaced by a regular file
    assert (tmp_path / "real.sbatch").read_text().startswith("#!/bin/bash")


def _reading(pid: int, path: Path) -> bool:
    """Whether process `pid` is a reader of the FIFO `path`: blocked in its open() waiting for a
    writer (Linux's wchan `wait_for_partner`), or holding it open."""
    if Path(f"/proc/{pid}/wchan").read_text() in ("wait_for_partner", "fifo_open"):
        return True
    return any(os.readlink(fd) == str(path) for fd in Path(f"/proc/{pid}/fd").iterdir())


def test_output_writes_into_a_fifo_and_refuses_one_nobody_reads(tmp_path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE, text=True) as reader:
        eventually(
            lambda: _reading(reader.pid, fifo),
            retry_on=(OSError,),  # an fd closed while we looked
            timeout=HUNG_S,
            interval=0.01,
            what=f"{reader.pid} to open {fifo}",
            on_timeout=reader.kill,  # else leaving the block would wait for a cat blocked in open() forever
        )
        assert _render_to(str(fifo)).returncode == 0
        assert reader.communicate(timeout=HUNG_S)[0].startswith("#!/bin/bash")
    assert stat.S_ISFIFO(fifo.stat().st_mode)  # not replaced by a file
    proc = _render_to(str(fifo))  # no reader now: refused at once, not a hang
    assert proc.returncode == 2 and "no process reads" in proc.stderr


@pytest.mark.parametrize("target,words", [("nodir/x.sh", "create the folder"), (".", "give a file name")])
def test_output_errors_are_clear(tmp_path, target: str, words: str) -> None:
    proc = _render_to(target, cwd=tmp_path)
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("text", ["apiVersion: [\n", "clusters: 5\n", "- a\n"])
def test_an_invalid_kubeconfig_is_a_message(tmp_path, text: str) -> None:
    (tmp_path / "kubeconfig").write_text(text)
    proc = dj("status", "--backend", "k8s", "--kubeconfig", str(tmp_path / "kubeconfig"), "job")
    assert proc.returncode == 1 and "cannot load kubeconfig" in proc.stderr and "Traceback" not in proc.stderr


def test_env_refuses_a_rank_outside_its_world() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI", "PET_"))},
        "DIST_JOBS_ENV": "torchrun",
        "RANK": "7",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
    }
    proc = subprocess.run([PYTHON, "-m", "dist_jobs", "env"], capture_output=True, text=True, env=env, timeout=HUNG_S)
    assert proc.returncode == 3 and "rank 7" in proc.stderr and "outside world size 4" in proc.stderr
    assert "world_size        4" in proc.stdout  # what was resolved is still shown


def test_a_flag_whose_value_is_double_dash_keeps_it() -> None:
    """`--workdir=--` became [] ("must be text (given: [])"): argparse dropped the `--`."""
    proc = dj("render", "--backend", "slurm", "--procs-per-node", "1", "--workdir=--", "--env=A=--", "--", "prog")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --chdir=--" in proc.stdout.splitlines() and "export A=--" in proc.stdout.splitlines()
    # the bare `--` still starts the command
    assert '"$DJ_PY" -m dist_jobs.launch -- prog 2>"$step_errors" &' in proc.stdout
    status = dj("sweep", "status", "--checkpoint-dir=--", "nosuch")  # its own parser: a traceback before
    assert status.returncode == 2 and "Traceback" not in status.stderr and "no --/nosuch/sweep.json" in status.stderr


def test_an_image_that_reads_as_an_option_is_refused() -> None:
    """`--image=--foo=bar` rendered `apptainer exec --nv --foo=bar python3 ...`."""
    proc = dj("render", "--backend", "slurm", "--procs-per-node", "1", "--container", "apptainer", "--image=--foo=bar")
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert "image: starts with '-'" in proc.stderr and "(given: '--foo=bar')" in proc.stderr


def test_an_error_names_its_verb_once(tmp_path: Path) -> None:
    """cli.main puts `dist-jobs VERB: ` in front of every error; no message carries its own."""
    # no profile gives a backend: an empty config folder, no $DIST_JOBS_PROFILE
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(tmp_path), "DIST_JOBS_PROFILE": ""}
    argv = [PYTHON, "-m", "dist_jobs", "submit", "--procs-per-node", "1"]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=HUNG_S)
    assert proc.returncode == 2 and proc.stderr.startswith("dist-jobs submit: which scheduler? "), proc.stderr
    assert proc.stderr.count("dist-jobs submit:") == 1, proc.stderr


def test_set_problems_name_the_command_line_and_the_field_meant(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: a\nprocs_per_node: 1\n")
    proc = dj("render", "--backend", "slurm", str(job), "--set", "epochs=5", "--set", "slurm.partiton=gpu")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("dist-jobs render: command line: 2 problems\n"), proc.stderr  # not job.yaml's
    assert "--set epochs=5: `epochs` is not a spec field\n    fix: did you mean --set train.epochs=5?" in proc.stderr
    assert "fix: did you mean --set slurm.partition=gpu?" in proc.stderr
    spaced = dj("render", "--backend", "slurm", str(job), "--set", " train.lr = 0.5", "--set", "env.MY_VAR=x")
    assert spaced.returncode == 0 and "--lr=0.5" in spaced.stdout, spaced.stderr  # spaces around PATH and '='


def test_a_key_in_the_wrong_section_of_job_yaml_is_found_in_its_section(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("name: a\nprocs_per_node: 1\nepochs: 3\n")
    proc = dj("render", "--backend", "slurm", str(job))
    assert proc.returncode == 2 and "  - epochs: unknown key\n    fix: did you mean `train.epochs`?" in proc.stderr


def test_a_training_flag_given_to_dist_jobs_gets_its_set_spelling_and_the_verbs_usage() -> None:
    proc = dj("run", "--backend", "local", "--shm-allreduce", "--model", "gpt", "--data=text", "--no-progress")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("usage: dist-jobs run "), proc.stderr  # the verb's usage, not the top level's
    assert "dist-jobs run: unrecognized arguments: --shm-allreduce --model --data=text --no-progress" in proc.stderr
    fixes = "--set train.shm_allreduce=true --set train.model=gpt --set train.data=text --set train.progress=false"
    assert f"hint: training flags are spec fields: {fixes}\n" in proc.stderr
    other = dj("status", "--bogus", "local:///nowhere")
    assert other.returncode == 2 and other.stderr.startswith("usage: dist-jobs status ") and "hint" not in other.stderr


@pytest.mark.parametrize("backend", ["slurm", "local"])
def test_a_dry_run_with_snapshot_names_the_copy_it_runs_from_and_makes_none(tmp_path: Path, backend: str) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(tmp_path), "DIST_JOBS_PROFILE": ""}
    argv = [PYTHON, "-m", "dist_jobs", "submit", "--backend", backend, "--dry-run", "--snapshot", "--name", "snap",
            "--procs-per-node", "1", "--", "python3", "train.py"]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=proj, env=env, timeout=HUNG_S)
    assert proc.returncode == 0, proc.stderr
    into = {"slurm": proj / "dist-jobs-runs", "local": proj / "checkpoints" / "snap" / "local"}[backend]
    said = f"# snapshot: submit copies the code in {proj.resolve()} to {into.resolve()}/snapshots/snap-"
    assert said in proc.stderr, proc.stderr
    copy = proc.stderr.split(" to ", 1)[1].split("\n", 1)[0]
    if backend == "slurm":  # the script runs in the copy
        assert f"#SBATCH --chdir={copy}\n" in proc.stdout
    assert not (proj / "dist-jobs-runs").exists() and not (proj / "checkpoints").exists()  # nothing copied
