"""The Pythons the package promises are the ones the test matrix runs (noxfile.py reads the
classifiers): requires-python, the classifiers and the matrix name the same versions."""

from __future__ import annotations

import re

from support.paths import REPO


def test_requires_python_and_the_classifiers_promise_the_tested_versions() -> None:
    text = (REPO / "pyproject.toml").read_text()
    low, high = re.search(r'requires-python = ">=3\.(\d+),<3\.(\d+)"', text).groups()  # type: ignore[union-attr]
    classifiers = re.findall(r'"Programming Language :: Python :: 3\.(\d+)"', text)
    assert [int(v) for v in classifiers] == list(range(int(low), int(high)))
