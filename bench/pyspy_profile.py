"""Where the CPU goes (issue 7): a py-spy profile of a job's service processes, summarised by category.

    .venv/bin/python bench/pyspy_profile.py                        # co_train, 6 steps at the demo's size
    .venv/bin/python bench/pyspy_profile.py --mode single_agent    # the job of bench/trl_throughput.py
    .venv/bin/python bench/pyspy_profile.py --raw prof.txt         # summarise a raw profile again

Runs the job on a local cluster under `py-spy record --subprocesses --format raw` (py-spy is in the
`bench` extra and needs ptrace rights) and sorts every sample of each service process into one
category: the innermost frame that matches a category's pattern decides (model forward in the engine,
sampling, PPO update, HTTP client, HTTP server, Redis, pydantic/JSON, tokenizer, …; `other` when no
frame matches). Samples whose innermost frame waits (a lock, a queue, a socket, a sleep) count as
idle, not as CPU. Shares are of a process's on-CPU samples after start-up (imports and model loading
are counted apart, `startup_cpu_s`); `cpu_s` is samples / rate. Sampling slows
the run (about 10 % here), so read the shares, not the step times. Writes the raw stacks and
`summary.json` into `--out` and prints a table per process.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

STARTUP = "start-up (imports, model load)"
# Innermost match wins, so library frames (inner) beat the code that called them (outer).
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("sampling", ("_sample (mgrpo/engines/hf.py",)),
    ("engine model forward", ("HFEngine._forward",)),
    ("engine batching (join, retire, prefill setup)", ("HFEngine.", "_join (mgrpo", "_trim_left (mgrpo")),
    ("PPO update", ("ppo_update (mgrpo",)),
    ("checkpoint save", ("save_checkpoint (mgrpo",)),
    ("HTTP client (httpx)", ("httpx/", "httpcore/", "h11/")),
    ("HTTP server (uvicorn, FastAPI)", ("uvicorn/", "starlette/", "fastapi/", "anyio/")),
    ("Redis client", ("redis/",)),
    ("pydantic / JSON", ("pydantic", "json/")),
    ("tokenizer", ("tokenizers/", "tokenization_", "tokenization/")),
    ("episode codec, store", ("shared_store/",)),
    ("alignment, advantages, batching", ("mgrpo/algo/", "mgrpo/batching")),
    ("agent loop, tools, task", ("mgrpo/agents/", "mgrpo/tasks/")),
    (STARTUP, ("_find_and_load", "from_pretrained", "PlannerJob.__init__", "SubagentJob.__init__")),
]
WAITS = (
    "Condition.wait",
    "Event.wait",
    "Queue.get",
    "SimpleQueue.get",
    "sleep",
    "select (",
    "Thread.join",
    "_wait_for_tstate_lock",
    "acquire (",
    "recv_into",
    "_recv",
    "wait (threading",
    "readline",
    "_worker (concurrent/futures/thread.py",
    "process ",
    "SyncStream.read",
    "ThreadLock.__enter__",
    "_read_from_socket",
)
SERVICES = ("serve planner", "serve subagent", "serve controller")


def categorise(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, patterns in CATEGORIES:
            if any(p in frame for p in patterns):
                return name
    return "other"


def summarise(raw: Path, rate_hz: int) -> dict[str, Any]:
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    idle: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        service = next((s for s in SERVICES if len(frames) > 1 and s in frames[1]), None)
        if service is None:
            continue
        role = service.split()[1]
        if any(w in frames[-1] for w in WAITS) or any("Condition.wait" in f for f in frames[-3:]):
            idle[role] += int(count)
        else:
            per[role][categorise(frames[2:])] += int(count)
    out: dict[str, Any] = {}
    for role, counts in per.items():
        startup = counts.pop(STARTUP, 0)
        busy = sum(counts.values())
        out[role] = {
            "cpu_s": busy / rate_hz,
            "startup_cpu_s": startup / rate_hz,
            "idle_thread_s": idle[role] / rate_hz,
            "shares": {k: v / busy for k, v in counts.most_common()},
        }
    return out


def run_job(mode: str, steps: int, out: Path) -> None:
    """The profiled process: one job on a local cluster (its services are this process's children)."""
    from rich.console import Console

    from mgrpo.config import JobConfig
    from services.demo import run_train

    if mode == "single_agent":
        sys.path.insert(0, str(Path(__file__).parent))
        from trl_throughput import job_for

        job = job_for(
            argparse.Namespace(
                steps=steps, prompts=8, group=8, max_new_tokens=48, preset="tiny", max_staleness=0
            )
        )
    else:
        job = JobConfig(steps=steps)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache" if mode == "single_agent" else Path(".cache/mgrpo")
        final = run_train(job, out / "run", redis_url=None, cache_dir=cache, console=Console())
    if final["status"] != "succeeded":
        raise SystemExit(f"the job {final['status']}: {final['reason']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["co_train", "single_agent"], default="co_train")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--raw", type=Path, help="summarise this raw profile instead of recording one")
    ap.add_argument("--out", type=Path, default=Path("bench/results/profile"))
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # the profiled child
    args = ap.parse_args()
    out = args.out / args.mode
    if args.inner:
        run_job(args.mode, args.steps, out)
        return
    out.mkdir(parents=True, exist_ok=True)
    raw = args.raw
    if raw is None:
        raw = out / "raw.txt"
        py_spy = Path(sys.executable).parent / "py-spy"
        cmd = [
            str(py_spy),
            "record",
            "--subprocesses",
            "--nonblocking",
            "-r",
            str(args.rate),
            "--format",
            "raw",
            "-o",
            str(raw),
            "--",
            sys.executable,
            __file__,
            "--inner",
            "--mode",
            args.mode,
            "--steps",
            str(args.steps),
            "--out",
            str(args.out),
        ]
        if subprocess.run(cmd).returncode != 0:
            raise SystemExit(
                "py-spy failed: install it with pip install -e '.[dev,bench]' (it needs ptrace rights)"
            )
    summary = summarise(raw, args.rate)
    (out / "summary.json").write_text(
        json.dumps({"mode": args.mode, "rate_hz": args.rate, **summary}, indent=1)
    )
    for role, s in summary.items():
        print(f"{role}: {s['cpu_s']:.1f} CPU-s on CPU after start-up ({s['startup_cpu_s']:.1f} s start-up)")
        for k, v in s["shares"].items():
            if v >= 0.005:
                print(f"  {k:48s} {v:6.1%}")


if __name__ == "__main__":
    main()
