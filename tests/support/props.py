"""How many examples each property test tries.

A property test's own count is what the full session (the pinned torch's Python) tries. The
torch-free sessions run the same properties on each other promised Python to prove the code runs
there, not to search the same space again: noxfile.py sets DIST_JOBS_PROPERTY_SHARE to the share
of each count they try (every property still runs, with at least a few examples).
"""

from __future__ import annotations

import math
import os

SHARE = float(os.environ.get("DIST_JOBS_PROPERTY_SHARE", "1"))
FEWEST = 5


def examples(count: int) -> int:
    """`count` in the full session; its share, but at least FEWEST, elsewhere."""
    return max(min(count, FEWEST), math.ceil(count * SHARE))
