"""``python -m executor.slurm``: the Slurm bridge (:mod:`executor.slurm.bridge`)."""

import sys

from executor.slurm.bridge import main

if __name__ == "__main__":
    sys.exit(main())
