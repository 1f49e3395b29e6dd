import sys

from dist_jobs.cli import main

sys.exit(main())
