"""dist_jobs.spec.validate: every problem at once, each at its own path, with a fix; never a wrong pass."""

from __future__ import annotations

import subprocess

import pytest

from dist_jobs.errors import SpecError
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.train import TrainConfig
from support.paths import PYTHON
from support.waiting import HUNG_S

OK = {"name": "a", "procs_per_node": 1}


def problems(data: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        load_spec(data={**OK, **data})
    return {p.field: p.render() for p in err.value.problems}


@pytest.mark.parametrize(
    "field,value",
    [
        ("memory", "64G\n"),
        ("time", "10:00\n"),
        ("log_dir", "logs\n"),
        ("image", "img:1\n"),
    ],
)
def test_a_trailing_newline_is_not_a_match(field: str, value: str) -> None:
    # Python's `$` matches before a final newline; the newline would end an #SBATCH line early.
    assert list(problems({field: value})) == [field]


def test_each_list_item_and_dict_entry_is_reported_on_its_own() -> None:
    got = problems(
        {
            "setup": ["ok", "a\x00", "b\x00"],
            "env": {"A": "x\x00", "2B": "y", "C": 3},
            "k8s": {"tolerations": [{"key": "k"}, {"operator": "Nope", "keyy": 1}], "node_selector": {"a": "b\n"}},
        }
    )
    assert set(got) == {
        "setup[1]",
        "setup[2]",
        "env.A",
        "env.2B (the key)",
        "env.C",
        "k8s.tolerations[1].operator",
        "k8s.tolerations[1].keyy",
        "k8s.node_selector.a",
    }
    assert "NUL" in got["setup[1]"] and "MY_VAR" in got["env.2B (the key)"]
    assert "must be text" in got["env.C"] and "'Exists' or 'Equal'" in got["k8s.tolerations[1].operator"]
    assert "did you mean `key`" in got["k8s.tolerations[1].keyy"]


@pytest.mark.parametrize(
    "data,field,words",
    [
        ({"nodes": 5000}, "nodes", "at most 4096"),
        ({"nodes": True}, "nodes", "whole number"),
        ({"nodes": 2.5}, "nodes", "whole number"),
        ({"slurm": "gpu"}, "slurm", "mapping"),
        ({"setup": "module load x"}, "setup", "list"),
        ({"slurm": {"exclusive": "maybe"}}, "slurm.exclusive", "true or false"),
        ({"train": {"lr": 0}}, "train.lr", "greater than 0"),
        ({"k8s": {"shm_size": "8 GB"}}, "k8s.shm_size", "8Gi"),
        ({"preemption": {"grace_seconds": 10}}, "preemption.grace_seconds", "at least 30"),
        ({"master_port": 80}, "master_port", "at least 1024"),
        ({"command": ["python", 3]}, "command[1]", "must be text (given: 3)"),
        ({"nccl": {"debug": "LOUD"}}, "nccl.debug", "'VERSION', 'WARN', 'INFO' or 'TRACE'"),
    ],
)
def test_messages_name_the_rule_and_the_fix(data: dict, field: str, words: str) -> None:
    got = problems(data)
    assert list(got) == [field] and words in got[field], got


def test_strings_from_flags_become_numbers_and_booleans() -> None:
    spec = load_spec(data=OK, overrides={"nodes": "3", "slurm.exclusive": "true", "train.lr": "0.5"})
    assert (spec.nodes, spec.slurm.exclusive, spec.train.lr) == (3, True, 0.5)


def test_the_trainers_help_describes_switches_too(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        TrainConfig.from_argv(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    assert done.value.code == 0
    assert (
        "--shm-allreduce, --no-shm-allreduce CPU ranks on one host all-reduce gradients through /dev/shm, "
        "not loopback TCP (opt-in)" in text
    )
    assert "--scale-lr, --no-scale-lr scale lr by global batch / 256" in text


def test_train_flags_round_trip_and_bad_flags_exit_2() -> None:
    config = TrainConfig(epochs=3, lr=0.05, amp="bf16", sync_bn=True, preempt_signals=("SIGTERM",))
    assert TrainConfig.from_argv(config.to_argv()) == config
    proc = subprocess.run(
        [PYTHON, "-m", "dist_jobs.train", "--epochs", "0", "--amp", "fp32", "--lr", "x"],
        capture_output=True,
        text=True,
        timeout=HUNG_S,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    for flag in ("--epochs", "--amp", "--lr"):
        assert f"  - {flag}:" in proc.stderr, proc.stderr


def test_a_run_name_error_states_the_rule() -> None:
    """'r 1 ü' is one folder name: "not one folder name" was wrong; the rule is what it breaks."""
    got = problems({"train": {"run_name": "r 1 ü"}})
    assert list(got) == ["train.run_name"] and "[A-Za-z0-9_][A-Za-z0-9._-]{0,254}" in got["train.run_name"]
    assert "not one folder name" not in got["train.run_name"]


@pytest.mark.parametrize(
    "train,field,words",
    [
        ({"model": "-x"}, "train.model", "module:factory"),
        ({"data": "fake\x00"}, "train.data", "module:factory"),
        ({"data_root": "/d\x00"}, "train.data_root", "NUL"),
        ({"checkpoint_dir": "/c\x00"}, "train.checkpoint_dir", "NUL"),
        ({"preempt_signals": ["SIGUSR1,SIGTERM"]}, "train.preempt_signals[0]", "one signal per item"),
        ({"run_name": "../../x"}, "train.run_name", "is not a run name"),
        ({"run_name": "/abs/x"}, "train.run_name", "is not a run name"),
        ({"run_name": ".."}, "train.run_name", "is not a run name"),
        ({"run_name": "-r"}, "train.run_name", "is not a run name"),
    ],
)
def test_train_strings_are_validated_like_the_rest(train: dict, field: str, words: str) -> None:
    got = problems({"train": train})
    assert list(got) == [field] and words in got[field], got


def test_train_values_starting_with_a_dash_survive_the_flags() -> None:
    """`--data-root -data` made argparse stop the job at start; the value now rides in its flag."""
    config = TrainConfig(data_root="-data", checkpoint_dir="--ckpt", run_name="r-1", preempt_signals=("USR1", "TERM"))
    assert "--data-root=-data" in config.to_argv()
    assert TrainConfig.from_argv(config.to_argv()) == config


def test_train_entrypoint_refuses_a_run_name_that_leaves_the_checkpoint_dir(tmp_path) -> None:
    proc = subprocess.run(
        [PYTHON, "-m", "dist_jobs.train", "--checkpoint-dir", str(tmp_path), "--run-name", "../escaped"],
        capture_output=True,
        text=True,
        timeout=HUNG_S,
    )
    assert proc.returncode == 2 and "--run-name" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path.parent / "escaped").exists()
