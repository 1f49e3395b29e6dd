"""Test set-up: tests/ on sys.path (for `support`), the tier gate of support.tiers, and
`--torch-free`: the suite without the tests that need torch (support.torch_free and
`@requires("torch")`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from support import tiers  # noqa: E402
from support.torch_free import file_needs_torch  # noqa: E402

# One intra-op thread for every torch process the suite starts (this process's, the local runs',
# the SLURM jobs', which inherit it): several run at once on few cores, and torch's default of a
# thread per core then spends most of its CPU time spinning (README, Tests). A run that sets its
# own, or a developer who exports another value, wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--torch-free",
        action="store_true",
        help="leave out the test files that import torch and the tests marked torch (Pythons without a torch wheel)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires_tiers(*needs): needs these (support.tiers.requires)")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Workers (and what their tests start) run below the cluster tiers' own processes (slurmd's
        # job steps, the kubelets' pods): a job a test waits on keeps the timing it has on a quiet
        # machine while the other workers compute.
        os.nice(5)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    test_file = collection_path.suffix == ".py" and collection_path.name.startswith("test_")
    if test_file and config.getoption("--torch-free"):
        return file_needs_torch(collection_path) or None
    return None


# A cluster tier is one shared machine-wide resource (the 2-node SLURM cluster runs one job of
# the suite at a time well, not four): under pytest-xdist (`--dist loadgroup`) each tier's tests run
# on one worker, one after the other, while other workers run what needs no tier.
SHARED_TIERS = ("slurm", "realpods", "pods", "apiserver")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each need is also a marker (`-m 'not slurm and not apiserver'`); a shared tier is an xdist
    group. Here, as each test is collected: xdist reads the groups in its own modifyitems hook."""
    needs = [tier for mark in item.iter_markers("requires_tiers") for tier in mark.args]
    for tier in needs:
        item.add_marker(getattr(pytest.mark, tier))
    shared = [tier for tier in SHARED_TIERS if tier in needs]
    if shared and not item.get_closest_marker("xdist_group"):
        item.add_marker(pytest.mark.xdist_group(shared[0]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--torch-free"):
        dropped = [item for item in items if item.get_closest_marker("torch")]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if not item.get_closest_marker("torch")]


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("requires_tiers"):
        tiers.check(tuple(mark.args))


@pytest.fixture(autouse=True)
def _no_user_profiles(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The user's own ~/.config/dist-jobs/config.yaml (profiles) must not change what a test renders."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.getbasetemp() / "no-user-config"))
    # the record of submitted jobs (dist_jobs.backends.registry): each test's own, not the user's
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("DIST_JOBS_PROFILE", raising=False)
