"""Pipelined vs synchronous on the same work, measured through the real services (issue 13).

    .venv/bin/python bench/pipeline.py                       # deep_research, pinned and unpinned, 8 steps
    .venv/bin/python bench/pipeline.py --settings pinned --steps 6 --repeats 2
    .venv/bin/python bench/pipeline.py --set prompts_per_step=2 --set rollouts_per_query=8   # latency-bound

Each run is one `co_train` job at the demo's size (8 prompts × K 8 × D 4) on a local cluster. Arms:
`sync` (max_staleness 0, the paper's schedule) and `pipelined` (max_staleness 1). Settings:
`pinned` — each role's service on its own core (`taskset -c`), so a waiting role leaves its core idle
as it would leave its node idle; `unpinned` — both services share both cores (the gain is then
bounded by how busy the cores already are). The window is from the root's first finished step to the
job's end (step 0 loads models). Reported per run: steps/s, samples trained per second (every role),
the root's waiting share (`timing/wait_partner` over the step period), each core's busy fraction
(/proc/stat) and each service's CPU seconds (/proc/<pid>/stat), which `bench/pipeline_sim.py` reads
to predict the pipelined period from the synchronous run. Writes `results.json` into `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning import parse_sets

from mgrpo.config import JobConfig
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
from services.demo import _rows
from services.launcher import LocalCluster
from shared_store import Store, keys

ARMS = {"sync": 0, "pipelined": 1}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_times() -> list[tuple[int, int]]:
    """Per CPU (busy, total) jiffies from /proc/stat."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3].isdigit():
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]  # idle + iowait
            out.append((sum(v) - idle, sum(v)))
    return out


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def run_arm(
    arm: str, setting: str, steps: int, sets: dict[str, Any], cache: Path, out: Path, console: Console
) -> dict[str, Any]:
    job = JobConfig.model_validate({**sets, "steps": steps, "max_staleness": ARMS[arm]})
    cpus = {"planner": "0", "subagent": "1"} if setting == "pinned" else {}
    run_dir = out / f"{setting}-{arm}-{int(time.time())}"
    with LocalCluster(run_dir, extra_env={"MGRPO_CACHE_DIR": str(cache.resolve())}, cpus=cpus) as cluster:
        store = Store.connect(cluster.redis_url)
        base = cluster.url("controller")
        job_id = httpx.post(f"{base}/v1/jobs", json=job.model_dump(mode="json"), timeout=30).json()["job_id"]
        while store.ledger.last_step(job_id, "planner") < 0:
            time.sleep(0.05)
        t0, cores0 = time.perf_counter(), cpu_times()
        procs0 = {r: proc_cpu_s(cluster.procs[r].pid) for r in cluster.roles}
        while True:
            status = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()
            if status["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.05)
        window = time.perf_counter() - t0
        cores1 = cpu_times()
        procs1 = {r: proc_cpu_s(cluster.procs[r].pid) for r in cluster.roles}
        if status["status"] != "succeeded":
            raise RuntimeError(f"{setting}/{arm}: job {status['status']}: {status['reason']}")
        records = httpx.get(f"{base}/v1/jobs/{job_id}/metrics", timeout=30).json()["records"]
        counts: dict[bytes, bytes] = store.client.hgetall(keys.sample_counts(job_id))  # type: ignore[assignment]
    trained = sum(
        int(v)
        for k, v in counts.items()
        if k.decode().split(":")[1] == "trained" and int(k.decode().split(":")[2]) > 0
    )
    rows = [r for r in _rows(records) if r["step"] > 0]
    period = statistics.fmean(r["timing/period"] for r in rows)
    wait = statistics.fmean(r.get("timing/wait_partner", 0.0) for r in rows)
    busy = [(b1 - b0) / max(t1 - t0, 1) for (b0, t0), (b1, t1) in zip(cores0, cores1, strict=True)]
    phases = {
        k[len("timing/") :]: statistics.fmean(r.get(k, 0.0) for r in rows)
        for k in rows[-1]
        if k.startswith("timing/")
    }
    result = {
        "setting": setting,
        "arm": arm,
        "steps": steps,
        "job": sets,
        "window_s": window,
        "steps_per_s": (steps - 1) / window,
        "samples_per_s": trained / window,
        "root_period_s": period,
        "root_wait_share": wait / period,
        "core_busy": busy,
        "cpu_s": {r: procs1[r] - procs0[r] for r in procs0},
        "phases_s": phases,
        "delegations_per_rollout": statistics.fmean(r.get("planner/delegations_mean", 0.0) for r in rows),
    }
    console.print(
        f"{setting:9s} {arm:9s} {result['steps_per_s']:.3f} steps/s, {result['samples_per_s']:.1f} samples/s, "
        f"root waits {100 * result['root_wait_share']:.1f} %, {result['delegations_per_rollout']:.2f} delegations per rollout, cores busy "
        + ", ".join(f"{100 * b:.0f} %" for b in busy)
    )
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", nargs="+", choices=("pinned", "unpinned"), default=["pinned", "unpinned"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each arm (interleaved)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="job-config override")
    ap.add_argument("--out", type=Path, default=Path("bench/results/pipeline"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    cached_warmstart(job_spec(JobConfig()).warmstart_config(), args.cache_dir)
    runs = []
    for setting in args.settings:
        for _ in range(args.repeats):
            for arm in ARMS:
                runs.append(
                    run_arm(arm, setting, args.steps, parse_sets(args.set), args.cache_dir, args.out, console)
                )
                (args.out / "results.json").write_text(json.dumps({"runs": runs}, indent=1))
    for setting in args.settings:
        mine = {a: [r for r in runs if r["setting"] == setting and r["arm"] == a] for a in ARMS}
        ratio = [
            p["samples_per_s"] / s["samples_per_s"]
            for s, p in zip(mine["sync"], mine["pipelined"], strict=True)
        ]
        console.print(f"{setting}: pipelined / sync samples/s = " + ", ".join(f"{x:.2f}×" for x in ratio))
    console.print(f"wrote {args.out}/results.json")


if __name__ == "__main__":
    main()
