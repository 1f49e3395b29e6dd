"""The job spec: defaults, overrides, and errors that name field, value and fix, all at once."""

from __future__ import annotations

import subprocess

import pytest

from dist_jobs.errors import SpecError
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.slurm_time import format_time, parse_time
from support.paths import PYTHON
from support.waiting import HUNG_S


def test_defaults_and_arithmetic() -> None:
    spec = load_spec(data={"name": "a", "nodes": 2, "gpus_per_node": 4})
    assert spec.procs == 4 and spec.world_size == 8
    assert spec.argv[:3] == ["python3", "-m", "dist_jobs.train"]
    spec = load_spec(data={"name": "a", "nodes": 3, "gpus_per_node": 8, "procs_per_node": 4})
    assert spec.world_size == 12  # processes used, not GPUs present


def test_flags_override_file(tmp_path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: a\nnodes: 2\ngpus_per_node: 4\nslurm: {partition: cpu}\n")
    spec = load_spec(path, {"nodes": "3", "slurm.partition": "gpu", "train.epochs": 7})
    assert (spec.nodes, spec.slurm.partition, spec.train.epochs, spec.gpus_per_node) == (3, "gpu", 7, 4)


def test_all_problems_reported_once() -> None:
    with pytest.raises(SpecError) as err:
        load_spec(
            data={
                "name": "a",
                "nodes": "two",
                "launcher": "mpirun",
                "slurm": {"partiton": "x"},
                "env": {"1BAD": "v"},
                "memory": "lots",
            }
        )
    fields = [p.field for p in err.value.problems]
    assert len(fields) == 5, fields
    text = str(err.value)
    assert "nodes" in text and "'two'" in text and "whole number" in text
    assert "did you mean `partition`" in text
    assert "'srun' or 'torchrun'" in text
    assert "env.1BAD (the key)" in text
    assert "memory" in text and "'lots'" in text
    assert err.value.exit_code == 2


def test_cross_field_rules() -> None:
    with pytest.raises(SpecError) as err:
        load_spec(data={"name": "a", "nodes": 2})
    assert "procs_per_node" in str(err.value) and "CPU-only" in str(err.value)
    with pytest.raises(SpecError) as err:
        load_spec(data={"name": "a", "gpus_per_node": 2, "procs_per_node": 4})
    assert "procs_per_device" in str(err.value)
    ok = load_spec(data={"name": "a", "gpus_per_node": 1, "procs_per_node": 2, "train": {"procs_per_device": 2}})
    assert ok.procs == 2
    with pytest.raises(SpecError) as err:
        load_spec(data={"name": "a", "procs_per_node": 1, "time": "soon", "k8s": {"min_nodes": 2}})
    text = str(err.value)
    assert "time" in text and "HH:MM:SS" in text and "min_nodes/max_nodes" in text


def test_unknown_top_level_key_lists_known() -> None:
    with pytest.raises(SpecError) as err:
        load_spec(data={"name": "a", "procs_per_node": 1, "zzzz": 1})
    assert "unknown key" in str(err.value)


def test_bad_yaml_and_missing_file(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    "text,seconds",
    [("90", 5400), ("04:00:00", 14400), ("1-00:00:00", 86400), ("2-12", 216000), ("10:30", 630), ("0-01:02", 3720)],
)
def test_time_forms(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


def test_time_format_round_trip() -> None:
    assert format_time(86400 + 3661) == "1-01:01:01" and format_time(59) == "00:00:59"


def test_cli_bad_input_exit_2_no_traceback(tmp_path) -> None:
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "dist_jobs",
            "render",
            "--backend",
            "slurm",
            "--name",
            "x",
            "--nodes",
            "0",
            "--set",
            "slurm.qoss=a",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "nodes" in proc.stderr and "(given: '0')" in proc.stderr and "did you mean --set slurm.qos=a?" in proc.stderr
    assert proc.stderr.startswith("dist-jobs render: job spec and the command line: 2 problems\n"), proc.stderr


def test_nul_rejected() -> None:
    with pytest.raises(SpecError, match="NUL"):
        load_spec(data={"name": "a", "procs_per_node": 1, "env": {"A": "x\x00y"}})


@pytest.mark.parametrize(
    ("written", "directive"),
    [("10", "00:10:00"), ("'90'", "01:30:00"), ("1:30:00", "01:30:00"), ("2-12", "2-12:00:00")],
)
def test_a_bare_number_of_minutes_is_a_time_limit_as_slurm_reads_it(tmp_path, written: str, directive: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: a\nprocs_per_node: 1\ntime: {written}\n")
    proc = subprocess.run(
        [PYTHON, "-m", "dist_jobs", "render", "--backend", "slurm", str(job)],
        capture_output=True,
        text=True,
        timeout=HUNG_S,
    )
    assert proc.returncode == 0 and f"#SBATCH --time={directive}\n" in proc.stdout, proc.stderr


def test_a_time_limit_that_is_neither_minutes_nor_text_says_both_forms() -> None:
    with pytest.raises(SpecError) as err:
        load_spec(data={"name": "a", "procs_per_node": 1, "time": 1.5})
    assert "time: must be a whole number or text (given: 1.5)" in str(err.value)
