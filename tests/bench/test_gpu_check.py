"""bench/gpu_check.py, the GPU check's code, dry-run on the CPU (gloo, tiny sizes) so that it is
known to run before a GPU is lent: every part passes and writes its numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "MASTER_PORT": "29547"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/gpu_check.py"), "--device", "cpu", "--quick", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert all(
        summary[p]["ok"] for p in ("fsdp", "megatron", "megatron_moe", "mfu", "autocast", "weight_sync")
    ), summary
    assert 0 < summary["autocast"]["logprob_abs_diff_max"] < 1 and summary["autocast"]["update_s"] > 0
    for part in ("megatron", "megatron_moe"):
        assert summary[part]["round_trip_exact"] and summary[part]["logits_max_diff"] < 1e-4, part
    assert summary["fsdp"]["train_tokens_per_s"] > 0 and 0 < summary["mfu"]["mfu_vs_fp32_peak"] < 1
    assert summary["weight_sync"]["bytes"] > 0 and summary["weight_sync"]["sync_s"] > 0
