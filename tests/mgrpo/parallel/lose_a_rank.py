"""Started twice by test_ranks.py (RANK 0 and 1, no torchrun, so nothing stops rank 0 for it): rank 1
joins the open call and dies; rank 0's next call must raise RankLost at once, and print it."""

from __future__ import annotations

import os
import time

from mgrpo.parallel.group import init_from_env
from mgrpo.parallel.ranks import RankGroup, RankLost
from tests.mgrpo.parallel.updates import LR, tiny

if __name__ == "__main__":
    assert init_from_env(timeout_s=60)
    ranks = RankGroup()
    model, _ = tiny()
    if os.environ["RANK"] == "1":
        ranks.serve_one()  # the open call
        os._exit(9)
    ranks.call("open", config=model.config.to_dict(), lr=LR, local={"source": model})
    time.sleep(1.0)
    t0 = time.monotonic()
    try:
        ranks.call("optimizer_state")
    except RankLost as exc:
        print(f"RankLost after {time.monotonic() - t0:.1f} s: {exc}", flush=True)
