"""Profiles in $XDG_CONFIG_HOME/dist-jobs/config.yaml: precedence file defaults < profile < job.yaml
< flags, selection by --profile / $DIST_JOBS_PROFILE / `default:`, `config show`, and bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from dist_jobs.spec.profiles import config_path, load_profile
from support.paths import PYTHON, REPO

CONFIG = {
    "default": "gpu",
    "defaults": {"checkpoint_dir": "/shared/ckpt", "slurm": {"account": "ml", "qos": "base"}, "procs_per_node": 1},
    "profiles": {
        "gpu": {"backend": "slurm", "slurm": {"partition": "gpu", "qos": "high"}, "procs_per_node": 2},
        "kube": {"backend": "k8s", "context": "prod", "k8s": {"namespace": "training"}},
    },
}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "dist-jobs").mkdir(parents=True)
    (tmp_path / "xdg" / "dist-jobs" / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({"name": "demo", "slurm": {"qos": "low"}}))
    return tmp_path


def dj(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([PYTHON, "-m", "dist_jobs", *args], capture_output=True, text=True, cwd=cwd, env=full)


def test_the_config_file_lives_under_xdg_config_home_or_dot_config() -> None:
    assert config_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/dist-jobs/config.yaml")
    assert config_path({"HOME": "/h"}) == Path("/h/.config/dist-jobs/config.yaml")


def test_precedence_is_file_defaults_then_profile_then_job_yaml_then_flags(home: Path) -> None:
    proc = dj("render", "job.yaml", "--nodes", "2", "--partition", "debug", cwd=home)  # backend: the profile's
    assert proc.returncode == 0, proc.stderr
    script = proc.stdout
    assert "#SBATCH --partition=debug" in script  # flag over the profile
    assert "#SBATCH --qos=low" in script  # job.yaml over the profile over the file's defaults
    assert "#SBATCH --account=ml" in script  # the file's defaults
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=2" in script  # the profile's procs
    assert "/shared/ckpt" in script


# what the backend registry tells load_profile (the CLI hands it every backend's options)
SCHEDULERS = {"slurm": ["jobs_dir"], "k8s": ["context", "kubeconfig"], "local": []}


def test_a_profile_is_chosen_by_flag_then_environment_then_default(home: Path, monkeypatch) -> None:
    assert load_profile(schedulers=SCHEDULERS).name == "gpu"
    monkeypatch.setenv("DIST_JOBS_PROFILE", "kube")
    chosen = load_profile(schedulers=SCHEDULERS)
    assert chosen.name == "kube" and chosen.options == {"backend": "k8s", "context": "prod"}
    assert chosen.spec["k8s"] == {"namespace": "training"} and chosen.spec["slurm"]["qos"] == "base"
    assert load_profile("gpu", schedulers=SCHEDULERS).spec["slurm"] == {
        "account": "ml",
        "qos": "high",
        "partition": "gpu",
    }


@pytest.mark.parametrize("order", ["spec first", "flags first"])
def test_config_show_tells_where_each_value_came_from(home: Path, order: str) -> None:
    """The spec before or after the flags, as with every verb."""
    flags = ["--nodes", "3", "-o", "json"]
    args = ["job.yaml", *flags] if order == "spec first" else [*flags, "job.yaml"]
    proc = dj("config", "show", *args, cwd=home)
    assert proc.returncode == 0, proc.stderr
    rows = {r["field"]: (r["value"], r["from"]) for r in json.loads(proc.stdout)}
    config = str(home / "xdg" / "dist-jobs" / "config.yaml")
    assert rows["backend"] == ("slurm", f"profile gpu ({config})")
    assert rows["slurm.partition"] == ("gpu", f"profile gpu ({config})")
    assert rows["slurm.account"] == ("ml", f"defaults ({config})")
    assert rows["slurm.qos"] == ("low", "job.yaml")
    assert rows["nodes"] == (3, "flag") and rows["gpus_per_node"] == (0, "default")


@pytest.mark.parametrize(
    "config, args, env, words",
    [
        (CONFIG, ["--profile", "nope"], {}, ["--profile", "'nope'", "gpu, kube"]),
        (CONFIG, [], {"DIST_JOBS_PROFILE": "gone"}, ["DIST_JOBS_PROFILE", "'gone'"]),
        ({"profiles": {"p": {"slurm": {"partion": "x"}}}}, ["--profile", "p"], {}, ["profiles.p.slurm", "partition"]),
        ({"profiles": {"p": {"nodes": "many"}}}, ["--profile", "p"], {}, ["profiles.p.nodes", "'many'"]),
        ({"profiles": {"p": {"backend": "pbs"}}}, ["--profile", "p"], {}, ["profiles.p.backend", "'pbs'", "slurm"]),
        ({"profile": {}}, [], {}, ["profile", "default, defaults, profiles"]),
    ],
)
def test_bad_profiles_exit_2_naming_the_field_the_value_and_the_fix(
    home: Path, config: dict, args: list[str], env: dict[str, str], words: list[str]
) -> None:
    (home / "xdg" / "dist-jobs" / "config.yaml").write_text(yaml.safe_dump(config))
    proc = dj("config", "show", *args, cwd=home, env=env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr
    assert "fix:" in proc.stderr


def test_without_a_config_file_nothing_changes_and_a_named_profile_is_an_error(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "none")}
    proc = dj("render", "--backend", "slurm", "--procs-per-node", "1", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = dj("render", "--profile", "gpu", "--procs-per-node", "1", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "no config file" in proc.stderr
    proc = dj("render", "--procs-per-node", "1", cwd=tmp_path, env=env)
    assert proc.returncode == 2 and "--backend" in proc.stderr and "Traceback" not in proc.stderr


def test_a_sweep_takes_the_profile_under_its_job_yaml(home: Path) -> None:
    proc = dj("sweep", "job.yaml", "--grid", "train.lr=0.1,0.01", "--dry-run", cwd=home)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --partition=gpu" in proc.stdout and "#SBATCH --qos=low" in proc.stdout
    assert "#SBATCH --account=ml" in proc.stdout
