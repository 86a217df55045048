"""Rank 0's calls: a rank that dies fails rank 0's next call at once with RankLost (which the service
turns into a restart of its group, not a failed job)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shared_store.embedded import free_port

ROOT = Path(__file__).resolve().parents[3]


def test_a_dead_rank_fails_the_next_call_with_rank_lost():
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    script = str(ROOT / "tests/mgrpo/parallel/lose_a_rank.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=30)
    assert procs[0].returncode == 0, err[-3000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RankLost")]
    assert float(line.split()[2]) < 10, line  # not the group's timeout (60 s here, a week in service)
    assert "is gone" in line


def test_a_lora_role_on_megatron_ranks_is_refused_with_what_to_do():
    import pytest

    from mgrpo.parallel.ranks import RankGroup

    with pytest.raises(ValueError, match="fsdp backend only"):
        RankGroup("megatron").calls["open"](config={}, lr=1e-3, lora={"rank": 8})
