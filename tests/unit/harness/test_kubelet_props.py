"""Values reach the process exactly as written through the kubelet, which expands `$(VAR)` and
turns `$$` into `$` in env values, command and args (support.kubelet plays it, as the operator
harness does when it starts pods): the manifest writes every `$` as `$$`."""

from __future__ import annotations

from pathlib import PurePosixPath

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dist_jobs.render import render
from dist_jobs.render.quoting import kubelet_literal
from dist_jobs.spec import run_id
from dist_jobs.spec.k8s_names import dns1035
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.reserved import reserved
from support import kubelet
from support.operator_harness import pods
from support.props import examples
from support.specs import direct_pods_spec

text = st.text(st.characters(blacklist_characters="\x00\r", blacklist_categories=("Cs",)), max_size=40)
one_line = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20)
env_names = st.from_regex(r"[A-Z][A-Z0-9_]{0,10}", fullmatch=True).filter(
    # Names the launch or the operator set (refused at spec time).
    lambda n: (
        not n.startswith(("SLURM", "DIST_JOBS", "MASTER", "PATH", "PYTHON", "LD_", "PET_")) and reserved(n) is None
    )
)
# Kubernetes' own syntax for label keys and values (anything else is refused at spec time).
# The prefix is a DNS subdomain: dot-separated labels, none empty ("0..0/" is refused, rightly).
label_keys = st.from_regex(
    r"([a-z0-9]([a-z0-9-]{0,4}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,4}[a-z0-9])?)?/)?"
    r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,10}[A-Za-z0-9])?",
    fullmatch=True,
).filter(lambda k: k not in ("dist-jobs/run", "app.kubernetes.io/managed-by", "dist-jobs/submission"))
label_values = st.from_regex(r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?)?", fullmatch=True)
names = text.filter(lambda s: bool(run_id(s)) and bool(dns1035(s)))
PROPS = settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(
    name=names,
    env=st.dictionaries(env_names, text, max_size=4),
    args=st.lists(text, max_size=4),
    ckpt=text.filter(bool),
    workdir=one_line,
    labels=st.dictionaries(label_keys, label_values, max_size=2),
    annotations=st.dictionaries(label_keys.map(str.lower), text, max_size=2),
)
def test_manifest_round_trip_through_yaml_and_the_kubelet(
    name: str, env: dict, args: list, ckpt: str, workdir: str, labels: dict, annotations: dict
) -> None:
    spec = load_spec(data=direct_pods_spec(name, env, args, ckpt, workdir, labels, annotations))
    doc = yaml.safe_load(render(spec, "k8s"))
    assert doc["metadata"]["name"] == dns1035(name, 63 - len("-worker-2"))
    for rtype in ("Master", "Worker"):
        tmpl = doc["spec"]["pytorchReplicaSpecs"][rtype]["template"]
        assert tmpl["spec"]["containers"][0]["workingDir"] == "/" + workdir
        assert {k: tmpl["metadata"]["labels"][k] for k in labels} == labels
        assert tmpl["metadata"].get("annotations", {}) == annotations
    for pod in pods(doc):  # what each process gets once the kubelet has expanded $(VAR) and $$
        assert pod.command[4:] == ["python3", "-m", "dist_jobs.launch", "--", "python3", "t.py", *args]
        assert {k: pod.env[k] for k in env} == env
        # the same folder (the run directory's owner normalises the path: "0/" is "0")
        assert PurePosixPath(pod.env["DIST_JOBS_CHECKPOINT_DIR"]) == PurePosixPath("/" + ckpt)


def test_values_the_kubelet_would_rewrite_arrive_as_written() -> None:
    """The issue's examples: unescaped, `cost $$5` arrives as `cost $5` and `$(DIST_JOBS_RUN)` as the run."""
    spec = load_spec(
        data={
            "name": "dollars",
            "procs_per_node": 1,
            "image": "img:1",
            "env": {"A": "cost $$5", "B": "$(A) and $(NOPE) and $", "C": "$(DIST_JOBS_RUN)"},
            "command": ["python3", "t.py", "--x=$(DIST_JOBS_RUN)", "$$", "$(", "é$é"],
            "k8s": {"launch": "direct"},
        },
        backend="k8s",
    )
    doc = yaml.safe_load(render(spec, "k8s"))
    container = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    raw = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert kubelet.expand("cost $$5", {}) == "cost $5"  # what the unescaped value would have become
    assert kubelet.expand("--x=$(DIST_JOBS_RUN)", {"DIST_JOBS_RUN": "dollars"}) == "--x=dollars"
    assert raw["A"] == "cost $$$$5" and container["command"][-4] == "--x=$$(DIST_JOBS_RUN)"
    (pod,) = pods(doc)
    assert {k: pod.env[k] for k in "ABC"} == spec.env
    assert pod.command[-4:] == ["--x=$(DIST_JOBS_RUN)", "$$", "$(", "é$é"]


@settings(max_examples=examples(300), deadline=None)
@given(value=text)
def test_kubelet_literal_round_trip(value: str) -> None:
    mapping = {"A": "x", "DIST_JOBS_RUN": "run", "": "empty"}
    assert kubelet.expand(kubelet_literal(value), mapping) == value


def test_kubelet_expansion_rules() -> None:
    """support.kubelet against the cases of Kubernetes' expand_test.go that matter here."""
    env = {"VAR_A": "A", "VAR_B": "B", "VAR_EMPTY": ""}
    cases = {
        "$(VAR_A)": "A",
        "___$(VAR_B)___": "___B___",
        "$(VAR_A)-$(VAR_B)": "A-B",
        "$(VAR_EMPTY)": "",
        "$(UNKNOWN)": "$(UNKNOWN)",
        "$$(VAR_A)": "$(VAR_A)",
        "$$$(VAR_A)": "$A",
        "$$": "$",
        "$$$$": "$$",
        "$": "$",
        "foo$": "foo$",
        "$(VAR_A": "$(VAR_A",
        "$VAR_A": "$VAR_A",
        "$()": "$()",
        "f$(VAR_A)$(VAR_B": "fA$(VAR_B",
    }
    assert {given: kubelet.expand(given, env) for given in cases} == cases
