"""`python -m dist_jobs.train.call CALL.pkl OUT.pkl`: one rank of a function the local backend runs
(`dist_jobs.call_local`). The launcher has exported the env:// contract; rank 0 writes the
function's return value to OUT.pkl. Exit codes are the entrypoint's: 200 after a preemption
checkpoint (fit() raised Preempted), 2 for bad input, 1 for other errors of dist-jobs.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

from dist_jobs.errors import DistJobsError
from dist_jobs.rundir.atomic import open_atomic


def main(argv: list[str]) -> int:
    call_file, out_file = argv
    with open(call_file, "rb") as f:
        fn, args, kwargs = pickle.load(f)  # written by this user's own call_local: trusted
    try:
        result = fn(*args, **kwargs)
    except DistJobsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if os.environ.get("RANK", "0") == "0":
        with open_atomic(Path(out_file)) as f:
            pickle.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
