"""Run names and Kubernetes names: distinct job names never share a run folder or a Kubernetes name."""

from __future__ import annotations

import re

import pytest

from dist_jobs.render.k8s import k8s_name
from dist_jobs.spec import run_id
from dist_jobs.spec.k8s_names import dns1035
from dist_jobs.spec.load import load_spec

SWEEP = "sweep-resnet50-imagenet-" + "bs256-wd5e-4-cosine-warmup500-" * 5


@pytest.mark.parametrize(
    "names",
    [
        [SWEEP + "lr0.1", SWEEP + "lr0.2"],  # the reported sweep: cut at 128 before the hash was taken
        ["résumé", "rèsumè", "resume-é"],  # differ only in non-ASCII letters
        ["a b", "a_b", "a/b", "a  b", "a-b", "a:b"],  # differ only in separators
        ["Run", "run"],  # one Kubernetes name after lowercasing
        ["123abc", "j-123abc"],  # the 'j-' prefix
        ["x" * 200, "x" * 201],
    ],
)
def test_distinct_names_get_distinct_run_folders_and_k8s_names(names: list[str]) -> None:
    specs = [load_spec(data={"name": n, "procs_per_node": 1, "nodes": 12, "image": "i:1"}) for n in names]
    assert len({s.run_id for s in specs}) == len(names)
    assert len({k8s_name(s) for s in specs}) == len(names)
    for spec in specs:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,126}[A-Za-z0-9]|[A-Za-z0-9]", spec.run_id), spec.run_id
        assert re.fullmatch(r"[a-z]([a-z0-9-]*[a-z0-9])?", k8s_name(spec))
        assert len(k8s_name(spec)) + len("-worker-12") <= 63


def test_safe_names_are_kept_and_others_end_in_a_hash() -> None:
    assert run_id("resnet50-ddp.v2") == "resnet50-ddp.v2"
    assert re.fullmatch(r"my-job-[0-9a-f]{10}", run_id("my job"))
    assert run_id("a-0123456789") != "a-0123456789"  # looks hashed: hashed again, never a collision
    assert len(run_id("y" * 500)) == 128
    assert dns1035("resnet50-ddp") == "resnet50-ddp"
    assert re.fullmatch(r"resnet-50-ddp-[0-9a-f]{10}", dns1035("ResNet_50 DDP!"))
    assert re.fullmatch(r"j-123abc-[0-9a-f]{10}", dns1035("123abc"))
    assert dns1035("---") == "" and run_id("---") == ""
