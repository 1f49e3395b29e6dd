import sys

from dist_jobs.launch import main

sys.exit(main())
