"""Property tests: arbitrary and hostile text in names, env values, arguments and paths survives rendering.

The sbatch script must pass `bash -n`, hold no CR LF (sbatch refuses the whole script), and
running it with stub srun/torchrun must hand them the exact argv and environment values and run
nothing else; PyYAML (YAML 1.2-ish) and kubectl (Go's YAML 1.1) must both read the exact values
back from the manifest. The hostile classes are the ones issue 14 found breaking things: YAML 1.1
booleans and numbers, bash-owned variable names, CR and CR LF, leading dashes, and long names
that differ only late (or only in separators and non-ASCII letters).
"""

from __future__ import annotations

import re
import string
import subprocess
import sys
import tempfile
from pathlib import Path, PurePosixPath

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dist_jobs.errors import SpecError
from dist_jobs.render import render
from dist_jobs.render.quoting import sh, yaml_value
from dist_jobs.spec import run_id
from dist_jobs.spec.k8s_names import dns1035
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.reserved import BASH_OWNED, DIST_JOBS_OWNED, TORCH_OWNED, reserved
from dist_jobs.spec.train import TrainConfig
from support import kubelet
from support.props import examples
from support.render_helpers import make_stubs, run_script, step_calls
from support.specs import direct_pods_spec
from support.yaml11 import KubectlRefused, read_like_kubectl, require_kubectl

# Any text a user could type or paste, minus NUL (no argv or env value can carry it).
text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=40)
one_line = st.text(
    st.characters(min_codepoint=32, blacklist_characters="\x7f", blacklist_categories=("Cs",)), min_size=1, max_size=30
)
# Plain scalars that a YAML 1.1 reader (kubectl) or a 1.2 reader turns into something else.
YAML_WORDS = (
    "y Y n N yes Yes YES no No NO on On ON off Off OFF true True FALSE ~ null Null NULL 0x1f 0o17 0777 1e3 "
    "1_000 1:30:00 190:20:30 .inf -.Inf .NaN << = 2020-01-01 2001-12-14t21:59:43.10-05:00 +1 -0 0b101 0.5"
).split()
# Characters that mean something to bash, YAML, sbatch or argparse, CR and CR LF among them.
PIECES = ["\r", "\n", "\r\n", "-", "--", " ", "'", '"', "\\", "$(touch x)", "`x`", "%", "#", ": ", "é", "\t", "*"]
hostile = st.one_of(
    text,
    st.sampled_from(YAML_WORDS),
    st.lists(st.sampled_from(PIECES + YAML_WORDS) | text, max_size=6).map("".join),
)
# A label value Kubernetes accepts, YAML 1.1 booleans and numbers among them.
LABEL_VALUE = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?"
label_values = st.sampled_from([w for w in YAML_WORDS if re.fullmatch(LABEL_VALUE, w)]) | st.from_regex(
    LABEL_VALUE, fullmatch=True
)
label_keys = st.from_regex(r"(example\.com/)?[a-z]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True) | st.sampled_from(
    ["y", "n", "on", "no", "true"]
)
BASH_NAMES = sorted(BASH_OWNED | {"IFS", "BASH_ENV", "ENV", "POSIXLY_CORRECT", "CDPATH", "GLOBIGNORE", "TMOUT"})
env_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True).filter(
    # Names the stub environment itself needs (PATH finds srun) or that the launch sets.
    lambda n: (
        not n.startswith(("SLURM", "DIST_JOBS", "MASTER", "PATH", "STUB", "PYTHON", "LD_")) and reserved(n) is None
    )
) | st.sampled_from(["Y", "N", "ON", "NO", "TRUE", "NULL"])
names = hostile.filter(lambda s: bool(run_id(s)) and bool(dns1035(s)))
PROPS = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def stubs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in srun and friends, made once for the module's examples."""
    folder = tmp_path_factory.mktemp("stubs")
    make_stubs(folder, sys.executable)
    return folder


@settings(max_examples=examples(400), deadline=None)
@given(value=hostile)
def test_sh_round_trip(value: str) -> None:
    word = sh(value)
    assert "\r" not in word  # sbatch refuses CR LF; a value's raw CR would sit at its line's end
    out = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True).stdout
    assert out.decode("utf-8", "surrogateescape") == value


@settings(max_examples=examples(500), deadline=None)
@given(
    value=st.recursive(
        hostile | st.integers() | st.booleans(),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(hostile, c, max_size=3),
        max_leaves=8,
    )
)
def test_yaml_value_round_trip(value: object) -> None:
    assert yaml.safe_load("k: " + yaml_value(value))["k"] == value


# Each example runs the whole batch script under bash with its stubbed srun (a python start-up a
# call): 30 of them, half of PROPS, keep the suite's slowest unit test near 20 s.
@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=names,
    env=st.dictionaries(env_names, hostile, max_size=3),
    args=st.lists(hostile, max_size=4),
    ckpt=hostile,
    log=one_line,
    launcher=st.sampled_from(["srun", "torchrun"]),
)
def test_script_reproduces_argv_and_env(
    stubs: Path, name: str, env: dict, args: list, ckpt: str, log: str, launcher: str
) -> None:
    ckpt_rel = "ck-" + ckpt.replace("/", "_")  # relative and inside the test folder: the script mkdirs it
    log_rel = "lg-" + log.replace("/", "_")
    spec = load_spec(
        data={
            "name": name,
            "nodes": 2,
            "procs_per_node": 2,
            "launcher": launcher,
            "env": env,
            "command": ["python3", "-u", "user script.py", *args],
            "checkpoint_dir": ckpt_rel,
            "log_dir": log_rel,
        }
    )
    script = render(spec, "slurm")
    assert "\r\n" not in script  # sbatch: "Batch script contains DOS line breaks"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "job.sbatch").write_text(script)
        assert subprocess.run(["bash", "-n", str(work / "job.sbatch")]).returncode == 0
        proc, calls = run_script(script, work, stubs)
        assert proc.returncode == 0, proc.stderr
        assert not (work / "x").exists()  # no `$(touch x)` ran
        (srun,) = step_calls(calls)
        expected_tail = ["python3", "-u", "user script.py", *args]  # torchrun too: interpreter and flags kept
        tail = srun["argv"][-len(expected_tail) :]
        if launcher == "torchrun":  # what torchrun does to each worker arg (torch's elastic `macros`)
            tail = [string.Template(word).safe_substitute(local_rank="0") for word in tail]
        assert tail == expected_tail
        # Every process runs through the per-task launcher (torchrun: --no-python, then the launcher).
        assert srun["argv"][-len(expected_tail) - 3 : -len(expected_tail)] == ["-m", "dist_jobs.launch", "--"]
        if launcher == "torchrun":
            assert "--no-python" in srun["argv"][: -len(expected_tail)]
        for key, value in env.items():
            assert srun["env"][key] == value
        assert srun["env"]["DIST_JOBS_RUN"] == run_id(name)
        assert srun["env"]["DIST_JOBS_CHECKPOINT_DIR"] == str(work / ckpt_rel)
        assert srun["env"]["DIST_JOBS_LOG_DIR"] == str(work / log_rel)


def test_torchrun_mode_args_survive_torchruns_own_substitution(tmp_path: Path, stubs: Path) -> None:
    """torchrun turns `$$` into `$` and `${local_rank}` into the local rank in every worker arg
    (string.Template in torch's elastic `macros`): the script escapes them for it."""
    words = ["$$x", "${local_rank}", "$local_rank", "a$b"]
    data = {"name": "t", "nodes": 2, "procs_per_node": 2, "launcher": "torchrun", "command": ["python3", *words]}
    spec = load_spec(data=data)
    proc, calls = run_script(render(spec, "slurm"), tmp_path, stubs)
    assert proc.returncode == 0, proc.stderr
    (srun,) = step_calls(calls)
    assert [string.Template(w).safe_substitute(local_rank="1") for w in srun["argv"][-4:]] == words


@PROPS
@given(name=st.sampled_from(BASH_NAMES + sorted(DIST_JOBS_OWNED | TORCH_OWNED)), value=hostile)
def test_env_names_bash_or_the_launch_own_are_refused_or_delivered(stubs: Path, name: str, value: str) -> None:
    """A name in `env:` is refused at spec time, or its value reaches the program exactly."""
    try:
        spec = load_spec(data={"name": "n", "nodes": 2, "procs_per_node": 1, "env": {name: value}})
    except SpecError as err:
        assert [p.field for p in err.problems] == [f"env.{name} (the key)"]
        return
    with tempfile.TemporaryDirectory() as tmp:
        proc, calls = run_script(render(spec, "slurm"), Path(tmp), stubs)
        assert not (Path(tmp) / "x").exists()
    assert proc.returncode == 0, proc.stderr
    (srun,) = step_calls(calls)
    assert srun["env"][name] == value


@PROPS
@given(
    name=names,
    env=st.dictionaries(env_names, hostile, max_size=4),
    args=st.lists(hostile, max_size=4),
    ckpt=hostile.filter(bool),
    workdir=one_line,
    labels=st.dictionaries(label_keys, label_values, max_size=2),
    annotations=st.dictionaries(label_keys, hostile, max_size=2),
)
def test_manifest_reads_back_the_same_in_yaml_1_1_and_1_2(
    name: str, env: dict, args: list, ckpt: str, workdir: str, labels: dict, annotations: dict
) -> None:
    require_kubectl()
    spec = load_spec(data=direct_pods_spec(name, env, args, ckpt, workdir, labels, annotations))
    manifest = render(spec, "k8s")
    doc = yaml.safe_load(manifest)
    try:
        assert read_like_kubectl(manifest) == doc  # kubectl (YAML 1.1) reads what PyYAML reads
    except KubectlRefused as exc:
        pytest.fail(f"kubectl cannot read the manifest: {exc}")
    assert doc["metadata"]["name"] == dns1035(name, 63 - len("-worker-2"))
    for rtype in ("Master", "Worker"):
        tmpl = doc["spec"]["pytorchReplicaSpecs"][rtype]["template"]
        container = tmpl["spec"]["containers"][0]
        # Every `$` is doubled for the kubelet (test_kubelet_props.py): undo that to compare.
        command = [kubelet.expand(word, {}) for word in container["command"][4:]]
        assert command == ["python3", "-m", "dist_jobs.launch", "--", "python3", "t.py", *args]
        got_env = {e["name"]: kubelet.expand(e["value"], {}) for e in container["env"] if "value" in e}
        assert {k: got_env[k] for k in env} == env
        # the same folder (the run directory's owner normalises the path: "0/" is "0")
        assert PurePosixPath(got_env["DIST_JOBS_CHECKPOINT_DIR"]) == PurePosixPath("/" + ckpt)
        assert container["workingDir"] == "/" + workdir
        assert {k: tmpl["metadata"]["labels"][k] for k in labels} == labels
        assert tmpl["metadata"].get("annotations", {}) == annotations


@settings(max_examples=examples(300), deadline=None)
@given(
    prefix=st.text(min_size=100, max_size=300),
    a=hostile,
    b=hostile,
    separator=st.sampled_from(["", " ", "_", "-", "/", ".", "é", "--"]),
)
def test_names_that_differ_late_stay_distinct(prefix: str, a: str, b: str, separator: str) -> None:
    """Long names differing only at the end, or only in separators or non-ASCII letters."""
    assume(a != b)
    first, second = prefix + separator + a, prefix + separator + b
    assume(run_id(first) and run_id(second))
    assert run_id(first) != run_id(second)
    assert dns1035(first, 50) != dns1035(second, 50)
    assert len(run_id(first)) <= 128 and len(dns1035(first, 50)) <= 50


@settings(max_examples=examples(300), deadline=None)
@given(data_root=hostile, ckpt=hostile, model=st.sampled_from(["resnet18", "pkg.models:build"]))
def test_train_flags_carry_any_value(data_root: str, ckpt: str, model: str) -> None:
    """A value starting with '-' (or holding '=', ',' or a newline) survives the entrypoint's argv."""
    config = TrainConfig(data_root=data_root, checkpoint_dir=ckpt, model=model)
    assert TrainConfig.from_argv(config.to_argv()) == config


def test_dns1035_rule() -> None:
    assert dns1035("resnet-50-ddp") == "resnet-50-ddp"
    long = dns1035("x" * 100, 50)
    assert len(long) == 50 and long != dns1035("x" * 101, 50)
    assert dns1035("---") == ""
