"""`python -m prunelab.gpu_check`: the same as `prunelab-gpu-check`."""

import sys

from prunelab.gpu_check import main

sys.exit(main())
