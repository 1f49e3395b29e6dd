"""Where things are: the checkout, the tests, the interpreter running them."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
PYTHON = sys.executable


def venv_bin() -> Path:
    return Path(sys.executable).parent
