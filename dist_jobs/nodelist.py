"""`python3 -m dist_jobs.nodelist`: a stable entry point of rendered job scripts.

The code lives in `dist_jobs.ranks.nodelist`. This name stays because scripts rendered by an earlier
version call it, and a requeued job runs its old script against the installed package.
"""

import sys

from dist_jobs.ranks.nodelist import main

if __name__ == "__main__":
    sys.exit(main())
