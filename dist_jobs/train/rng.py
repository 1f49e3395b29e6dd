"""Every RNG a training step draws from (Python, numpy, torch CPU and CUDA), as plain
tensors and numbers: a checkpoint loads with `weights_only=True`, so no pickled state."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import torch


def rng_state() -> dict[str, Any]:
    """Capture python, numpy, torch CPU and (current device) CUDA RNG state as plain types.

    A resumed run must draw the same numbers (augmentation, dropout, shuffling) an uninterrupted
    one would. weights_only loading rejects numpy arrays and arbitrary tuples of objects, so numpy's
    key array becomes an int64 tensor and the rest plain ints/floats/strings.
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": {"version": version, "state": list(internal), "gauss": gauss}}
    np: Any
    try:
        import numpy as np  # numpy is optional for torch; nothing to capture without it
    except ImportError:
        np = None
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {
            "name": str(name),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(cached),
        }
    state["torch"] = torch.get_rng_state()
    # Current device only: each DDP rank owns one device, and the device count may differ at resume.
    state["cuda"] = torch.cuda.get_rng_state() if torch.cuda.is_available() else None
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what rng_state() captured; parts absent here (numpy, CUDA) are skipped."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "numpy" in state:
        import numpy as np  # it was there when the state was captured

        npst = state["numpy"]
        keys = npst["keys"].numpy().astype(np.uint32)
        np.random.set_state((npst["name"], keys, npst["pos"], npst["has_gauss"], npst["gauss"]))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
