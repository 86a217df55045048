"""Growth (issue 7): step time and Redis memory as K, D and prompts per step grow, and Redis memory
over a long run.

    .venv/bin/python bench/growth.py                   # the table (7 configs) and a 200-step run
    .venv/bin/python bench/growth.py --long-steps 0    # the table only

Each config is a `co_train` job from the cached warm start on its own local cluster (fresh embedded
Redis, the three services as processes). While it runs, Redis `INFO memory` is sampled every 0.5 s;
the table reports the median step time (step 0, which loads models, is dropped), the peak
`used_memory` above the idle server, and the keys left when the job ends. The long run samples
`used_memory` after every step of a small job, and how much of it is the job's history (the metrics
stream and the ledger, which are kept): flat once the history is set aside means the progress-driven
garbage collection keeps only the steps both trainers still need. Writes `results.json` and
`growth.png`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import redis

from mgrpo.config import JobConfig
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart
from services.launcher import LocalCluster
from shared_store import keys

BASE = {"prompts_per_step": 8, "rollouts_per_query": 8, "subagent_slots_per_rollout": 4}
VARIANTS = [
    {},
    {"rollouts_per_query": 4},
    {"rollouts_per_query": 16},
    {"subagent_slots_per_rollout": 2},
    {"subagent_slots_per_rollout": 8},
    {"prompts_per_step": 4},
    {"prompts_per_step": 16},
]


def run_job(job: JobConfig, out: Path, cache_dir: Path, per_step: bool = False) -> dict[str, Any]:
    env = {"MGRPO_CACHE_DIR": str(cache_dir.resolve())}
    with LocalCluster(out, extra_env=env) as cluster:
        r = redis.Redis.from_url(str(cluster.redis_url))
        idle = int(r.info("memory")["used_memory"])
        base = cluster.url("controller")
        job_id = httpx.post(f"{base}/v1/jobs", json=job.model_dump(mode="json"), timeout=30).json()["job_id"]
        peak, by_step, history, status = idle, {}, {}, "queued"
        history_keys = [keys.stream(job_id, "events"), keys.ledger(job_id), keys.ledger_log(job_id)]
        while status not in ("succeeded", "failed", "cancelled"):
            info = httpx.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()
            status, done = info["status"], info["steps_done"]["planner"]
            used = int(r.info("memory")["used_memory"])
            peak = max(peak, used)
            if per_step and done >= 0 and done not in by_step and info["steps_done"]["subagent"] >= done:
                by_step[done] = used
                history[done] = sum(int(r.memory_usage(k, samples=0) or 0) for k in history_keys)
            time.sleep(0.5)
        if status != "succeeded":
            raise RuntimeError(f"job {status}: {info['reason']}")
        records = httpx.get(f"{base}/v1/jobs/{job_id}/metrics", timeout=30).json()["records"]
        n_keys = int(r.dbsize())
    steps = sorted({m["step"] for m in records if m["role"] == "planner" and m["step"] > 0})
    step_s = [
        next(m["values"]["timing/step"] for m in records if m["role"] == "planner" and m["step"] == s)
        for s in steps
    ]
    return {
        "median_step_s": statistics.median(step_s) if step_s else None,
        "idle_used_memory": idle,
        "peak_used_memory_above_idle": peak - idle,
        "keys_at_end": n_keys,
        "used_memory_by_step": by_step,
        "history_bytes_by_step": history,
    }


def plot(table: list[dict[str, Any]], long: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    labels = [
        f"P{r['prompts_per_step']} K{r['rollouts_per_query']} D{r['subagent_slots_per_rollout']}"
        for r in table
    ]
    axes[0].bar(labels, [r["peak_used_memory_above_idle"] / 2**20 for r in table], color="#47a")
    axes[0].set_ylabel("peak Redis used_memory above idle (MiB)")
    axes[0].tick_params(axis="x", rotation=45, labelsize=8)
    if long:
        mem = {int(s): v for s, v in long["used_memory_by_step"].items()}  # str keys once read from JSON
        hist = {int(s): v for s, v in long["history_bytes_by_step"].items()}
        steps = sorted(mem)
        used = [mem[s] / 2**20 for s in steps]
        history = [hist[s] / 2**20 for s in steps]
        axes[1].plot(steps, used, marker=".", label="used_memory")
        axes[1].plot(
            steps,
            [u - h for u, h in zip(used, history, strict=True)],
            marker=".",
            label="minus the job's history (metrics stream, ledger)",
        )
        axes[1].legend(fontsize=8)
        axes[1].set_xlabel("step")
        axes[1].set_ylabel("Redis used_memory (MiB)")
        axes[1].set_ylim(bottom=0)
        axes[1].set_title(f"{max(steps) + 1}-step run ({len(steps)} steps sampled)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4, help="steps per table config (the first is dropped)")
    ap.add_argument("--long-steps", type=int, default=200, help="steps of the memory run (0 skips it)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/growth"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cached_warmstart(job_spec(JobConfig()).warmstart_config(), args.cache_dir)
    table = []
    for i, variant in enumerate(VARIANTS):
        cfg = {**BASE, **variant}
        job = JobConfig.model_validate({**cfg, "steps": args.steps})
        row = {**cfg, **run_job(job, args.out / f"run-{i}", args.cache_dir)}
        row.pop("used_memory_by_step")
        row.pop("history_bytes_by_step")
        table.append(row)
        print(json.dumps(row), flush=True)
    long = None
    if args.long_steps:
        job = JobConfig.model_validate(
            {
                "steps": args.long_steps,
                "prompts_per_step": 2,
                "rollouts_per_query": 2,
                "subagent_slots_per_rollout": 2,
            }
        )
        long = run_job(job, args.out / "long", args.cache_dir, per_step=True)
        mem, hist = long["used_memory_by_step"], long["history_bytes_by_step"]
        first, last = min(mem), max(mem)
        print(
            json.dumps(
                {
                    "long_steps": args.long_steps,
                    "used_memory_first": mem[first],
                    "used_memory_last": mem[last],
                    "used_memory_max": max(mem.values()),
                    "history_bytes_first": hist[first],
                    "history_bytes_last": hist[last],
                }
            )
        )
    (args.out / "results.json").write_text(json.dumps({"table": table, "long": long}, indent=1))
    plot(table, long, args.out / "growth.png")


if __name__ == "__main__":
    main()
