"""SLURM hostlist expansion: a table, malformed input, the CLI, and scontrol as the oracle."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dist_jobs.errors import UsageError
from dist_jobs.ranks.nodelist import MAX_RANGE, expand, head, main
from support.paths import REPO
from support.tiers import require_tool
from support.waiting import HUNG_S

TABLE: list[tuple[str, list[str]]] = [
    ("n1", ["n1"]),
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("gpu[001-003]", ["gpu001", "gpu002", "gpu003"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[001-3]", ["n001", "n002", "n003"]),
    ("n[1,3-4,2]", ["n1", "n3", "n4", "n2"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
    ("n[1-2][5-6]", ["n15", "n16", "n25", "n26"]),
    ("[1-3]", ["1", "2", "3"]),
    ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
    ("n[1-2],m[07-08]", ["n1", "n2", "m07", "m08"]),
    ("n1,n1", ["n1", "n1"]),
    ("a,,b", ["a", "b"]),
    (" n1 , n2 ", ["n1", "n2"]),
    ("a b", ["a", "b"]),
    ("node-1.cluster,node-2.cluster", ["node-1.cluster", "node-2.cluster"]),
    # Suffixes after a bracket: newer SLURM accepts these; 22.05 still says "Invalid hostlist".
    ("a1,b[2-3]x,c", ["a1", "b2x", "b3x", "c"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("x[1-2]y[3-4]z", ["x1y3z", "x1y4z", "x2y3z", "x2y4z"]),
]

# (expression, words the message must contain, does scontrol 22.05 also reject it?)
MALFORMED: list[tuple[str, str, bool]] = [
    ("", "names no host", False),
    (" , ", "names no host", False),
    ("n[3-1]", "runs backwards", True),
    ("n[a-b]", "bad range 'a-b'", True),
    ("n[]", "empty brackets", True),
    ("n[1-2,]", "bad range ''", True),
    ("n[-3]", "bad range '-3'", True),
    ("n[1--3]", "bad range '1--3'", True),
    ("n[[1-2]]", "nested '['", True),
    (f"n[1-{MAX_RANGE + 5}]", "SLURM's limit", True),
    # SLURM keeps these as literal host names; a job would then dial a host that cannot exist.
    ("n[1-2", "'[' without ']'", False),
    ("n]", "']' without '['", False),
]


@pytest.mark.parametrize(("nodelist", "hosts"), TABLE)
def test_expand_table(nodelist: str, hosts: list[str]) -> None:
    assert expand(nodelist) == hosts
    assert head(nodelist) == hosts[0]


@pytest.mark.parametrize(("nodelist", "words", "_slurm_rejects"), MALFORMED)
def test_malformed_is_a_usage_error(nodelist: str, words: str, _slurm_rejects: bool) -> None:
    with pytest.raises(UsageError) as caught:
        expand(nodelist)
    assert words in caught.value.message
    assert caught.value.hint, "every error carries a hint"


def test_cartesian_blowup_is_refused() -> None:
    with pytest.raises(UsageError, match="expands to"):
        expand("n[1-60000][1-60000]")


@given(
    prefix=st.from_regex(r"[a-z][a-z-]{0,6}", fullmatch=True),
    low=st.integers(0, 5000),
    count=st.integers(1, 50),
    width=st.integers(1, 6),
)
def test_range_matches_brute_force(prefix: str, low: int, count: int, width: int) -> None:
    high = low + count - 1
    expr = f"{prefix}[{low:0{width}d}-{high}]"
    assert expand(expr) == [f"{prefix}{i:0{width}d}" for i in range(low, high + 1)]


def _scontrol() -> str:
    return require_tool("scontrol")  # SLURM's own expander, to compare with


def _scontrol_hostnames(scontrol: str, nodelist: str) -> list[str] | None:
    """scontrol's expansion, or None where it rejects the list (it still exits 0 then)."""
    # `show hostnames` expands locally; it needs no running controller.
    result = subprocess.run(
        [scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=HUNG_S, check=False
    )
    if result.returncode != 0 or "Invalid hostlist" in result.stdout + result.stderr:
        return None
    return result.stdout.split()


@pytest.mark.parametrize(("nodelist", "hosts"), TABLE)
def test_matches_scontrol(nodelist: str, hosts: list[str]) -> None:
    theirs = _scontrol_hostnames(_scontrol(), nodelist)
    if theirs is None and re.search(r"\][^\[\],\s]+($|[,\s\[])", nodelist):
        pytest.skip("this scontrol rejects text after ']' (newer SLURM accepts it)")
    assert theirs == expand(nodelist) == hosts


@pytest.mark.parametrize(("nodelist", "_words", "_slurm_rejects"), [m for m in MALFORMED if m[2]])
def test_scontrol_rejects_the_same(nodelist: str, _words: str, _slurm_rejects: bool) -> None:
    assert _scontrol_hostnames(_scontrol(), nodelist) is None


def test_main_prints_one_host_per_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["n[1-3]"]) == 0
    assert capsys.readouterr().out == "n1\nn2\nn3\n"
    assert main(["--head", "gpu[007-009]"]) == 0
    assert capsys.readouterr().out == "gpu007\n"
    assert main(["--count", "rack[1-2]-node[01-04]"]) == 0
    assert capsys.readouterr().out == "8\n"


def test_main_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["n[3-1]"]) == 2
    err = capsys.readouterr().err
    assert "error: range '3-1'" in err and "hint:" in err
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().err
    assert main(["--head", "a", "b"]) == 2


def test_module_runs_as_script_without_heavy_imports() -> None:
    heavy = "torch msgspec jinja2 yaml kubernetes numpy submitit jsonschema".split()
    code = (
        "import runpy, sys; sys.argv = ['x', '--head', 'n[4-5]'];"
        "runpy.run_module('dist_jobs.ranks.nodelist', run_name='__main__')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=HUNG_S, check=False
    )
    assert (result.returncode, result.stdout) == (0, "n4\n"), result.stderr
    probe = (
        f"import sys, dist_jobs.ranks.nodelist;print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=HUNG_S, check=True
    ).stdout.strip()
    assert loaded == "[]"


def test_python_dash_m_exit_code() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dist_jobs.ranks.nodelist", "--head", "n["],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=HUNG_S,
        check=False,
    )
    assert result.returncode == 2
    assert "'[' without ']'" in result.stderr
