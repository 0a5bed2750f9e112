"""A magnitude pruning that can be made slow, so a cluster test can cancel a run or let it reach its
time limit while it runs. PRUNELAB_TEST_SLOW_SEEDS (comma-separated seeds) selects the runs that
sleep PRUNELAB_TEST_SLOW_S seconds (600) in the allocate stage; the environment variables are not
part of the config, so a relaunch without them is the same setting and runs at full speed."""

from __future__ import annotations

import logging
import os
import time

from prunelab.pruning.magnitude import Magnitude

log = logging.getLogger(__name__)


class SlowMagnitude(Magnitude):
    def allocate(self, ctx):
        seeds = {int(s) for s in os.environ.get("PRUNELAB_TEST_SLOW_SEEDS", "").split(",") if s}
        if ctx.seed in seeds:
            seconds = float(os.environ.get("PRUNELAB_TEST_SLOW_S", "600"))
            log.info("slow run: sleeping %.0f s in allocate", seconds)
            time.sleep(seconds)
        return super().allocate(ctx)
