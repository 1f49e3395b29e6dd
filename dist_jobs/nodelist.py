"""`python3 -m dist_jobs.nodelist`: a stable entry point of rendered job scripts (the first host).

The sbatch template calls this name, not `dist_jobs.ranks.nodelist` where the code lives, on purpose:
a script stays in the queue (and is requeued) across upgrades of the package it runs against, so
the names a rendered script calls are an interface. Code can move inside `ranks/`; these names stay.
"""

import sys

from dist_jobs.ranks.nodelist import main

if __name__ == "__main__":
    sys.exit(main())
