"""Throughput against TRL (issue 7): single-agent GRPO samples/s of this system, through its services
and Redis, against TRL's `GRPOTrainer` (use_vllm off) on the same work, in one run.

    .venv/bin/pip install -e '.[dev,bench]'          # TRL is installed only for this benchmark
    .venv/bin/python bench/trl_throughput.py [--steps 8] [--repeats 2] [--preset tiny]

Same work on both sides: the same untrained preset model and tokenizer (random weights, so every
episode is one turn and both sides generate the same token distribution), the same prompts (stage-2
training questions, in our prompt format), the same group size G and prompts per step, at most
`--max-new-tokens` per sample, the same stop tokens (our single agent's closing tags and EOS, passed
to TRL as its model's `generation_config.eos_token_id`, which also ends its completion mask),
temperature 1, top-p 1, top-k off, the same optimizer (AdamW, lr 1e-4, no weight decay, grad clip
1.0, one optimizer step per generation batch), the same loss (clipped,
ε = 0.2 / 0.28, sequence-mean of token-means = TRL's `loss_type="grpo"`, β = 0). Ours runs as a
`single_agent` job on a local cluster (embedded Redis, controller, planner service: rollouts,
rewards, statistics to Redis, update, checkpoint, ledger every step); TRL runs in this process.
Step time is measured per step and the first step (start-up, compilation of kernels) is dropped;
the runs alternate ours/TRL `--repeats` times and the median step time of each side is reported.
Ours runs once per `hf` engine decoder (`ours`: the static KV cache, `ours_dynamic`: the HF forward,
`MGRPO_HF_STATIC_CACHE=0`; issue 18), so both ratios come from one run; with `--microbatch-tokens N`
a third time (`ours_microbatch`: the static decoder, the update in micro-batches of ≤ N padded tokens);
with `--whole-rows` also `ours_whole_rows`: the static decoder, `optim.shared_prefix` off (the update
runs every row's prompt itself); with `--engine-server` also `ours_engine_server`: the rollouts on an
`mgrpo engine` process (SGLang's API; every new policy pushed by broadcast), the trainer on one torch
thread (`OMP_NUM_THREADS=1`), and `max_staleness: 1`, so step s + 1 rolls out while step s trains —
**not the same algorithm as TRL's**: each update trains on samples one policy version old, corrected
by decoupled PPO's importance weights (docs/algorithm.md §7). `--max-staleness` sets the other arms'.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
from rich.console import Console

from mgrpo.agents.agents import _stop_ids, planner_prompt
from mgrpo.agents.format import SINGLE_STOPS
from mgrpo.config import JobConfig
from mgrpo.tasks.deep_research import make_questions
from mgrpo.workflows import job_spec
from mgrpo.workflows.deep_research_warmstart import cached_warmstart, job_task
from services.demo import run_train
from shared_store.embedded import free_port


def job_for(
    args: argparse.Namespace,
    microbatch_tokens: int = 0,
    shared_prefix: bool = True,
    max_staleness: int | None = None,
) -> JobConfig:
    return JobConfig.model_validate(
        {
            "mode": "single_agent",
            "warmstart_steps": 0,
            "steps": args.steps,
            "stage": 2,
            "prompts_per_step": args.prompts,
            "rollouts_per_query": args.group,
            "planner": {"preset": args.preset, "max_new_tokens_per_turn": args.max_new_tokens},
            "planner_optim": {
                "lr": 1e-4,
                "minibatch_size": args.prompts * args.group,
                "ppo_epochs": 1,
                "microbatch_tokens": microbatch_tokens,
                "shared_prefix": shared_prefix,
            },
            "max_staleness": args.max_staleness if max_staleness is None else max_staleness,
        }
    )


def run_ours(
    job: JobConfig,
    out: Path,
    cache_dir: Path,
    console: Console,
    *,
    static: bool,
    engine_model: Path | None = None,
) -> dict[str, Any]:
    """One run of our job; with `engine_model`, rolling out on an `mgrpo engine` server of its own
    (started from that folder, weights pushed by broadcast) and the trainer on one torch thread."""
    env = {"MGRPO_HF_STATIC_CACHE": "1" if static else "0"}  # read by every engine the job builds
    with contextlib.ExitStack() as stack:
        if engine_model is not None:
            url = stack.enter_context(engine_server(engine_model, out.parent / f"{out.name}-engine.log"))
            env |= {"MGRPO_SGLANG_URL": url, "MGRPO_SGLANG_SYNC_HOST": "127.0.0.1", "OMP_NUM_THREADS": "1"}
        stack.enter_context(mock.patch.dict(os.environ, env))  # the local cluster's services inherit it
        final = run_train(job, out, redis_url=None, cache_dir=cache_dir, console=console)
    if final["status"] != "succeeded":
        raise RuntimeError(f"our job {final['status']}: {final['reason']}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["timing/period"] for r in rows[1:]]  # between finished steps (= the step when synchronous)
    tokens = [r["planner/tokens"] for r in rows[1:]]
    phases = {k: statistics.fmean(r[k] for r in rows[1:]) for k in rows[1] if k.startswith("timing/")}
    return {"step_s": steps, "generated_tokens_per_step": statistics.fmean(tokens), "phases_s": phases}


@contextlib.contextmanager
def engine_server(model: Path, log: Path) -> Iterator[str]:
    """`mgrpo engine MODEL` in a process of its own, on a free local port: its URL once it answers."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "services.cli",
                "engine",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mgrpo engine did not start; see {log}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_trl(job: JobConfig, model_path: Path, cache_dir: Path, out: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = PreTrainedTokenizerFast.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    task = job_task(job)
    n = job.prompts_per_step * job.steps
    prompts = [
        tok.decode(planner_prompt(tok, q.text)) for q in make_questions(task.world, "train", 2, n, seed=7)
    ]
    stops = [int(tok.eos_token_id), *_stop_ids(tok, SINGLE_STOPS)]
    # TRL ends a completion's mask at the model's EOS ids only (`generation_config`); the stop tags
    # passed to `generate` alone left the padding after them counted and trained as completion tokens
    model.generation_config.eos_token_id = stops
    stamps: list[float] = []
    tokens: list[int] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **k: Any) -> None:
            stamps.append(time.perf_counter())

    def reward(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        tokens.append(sum(len(c) for c in completion_ids))
        return [0.0 for _ in completions]  # our single agent scores 0 too: random weights never answer

    G = job.rollouts_per_query
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=job.prompts_per_step * G,
        gradient_accumulation_steps=1,
        num_generations=G,
        max_completion_length=job_spec(job).model_of("planner").max_new_tokens_per_turn,
        max_steps=job.steps,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="grpo",
        num_iterations=1,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        generation_kwargs={"eos_token_id": stops},
        use_cpu=True,
        report_to=[],
        bf16=False,
        gradient_checkpointing=False,  # TRL defaults both on; ours trains in fp32 without recompute
        logging_steps=10_000,
        save_strategy="no",
        disable_tqdm=True,
        seed=job.run_seed,
        shuffle_dataset=False,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        processing_class=tok,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        callbacks=[Clock()],
    )
    gen_s: list[float] = []
    generate = trainer._generate_and_score_completions  # generation (+ rewards): timed apart from the update

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(*a, **k)
        gen_s.append(time.perf_counter() - t0)
        return out

    trainer._generate_and_score_completions = timed_generate
    torch.manual_seed(0)
    stamps.append(time.perf_counter())
    trainer.train()
    steps = [b - a for a, b in itertools.pairwise(stamps[1:])]  # stamps[0] is the start: drop the first step
    return {
        "step_s": steps,
        "generated_tokens_per_step": statistics.fmean(tokens[1:]),
        "generate_s": statistics.fmean(gen_s[1:]),
    }


RATIO_KEYS = {
    "ours": "samples_per_s_ratio",
    "ours_dynamic": "dynamic_samples_per_s_ratio",
    "ours_microbatch": "microbatch_samples_per_s_ratio",
    "ours_whole_rows": "whole_rows_samples_per_s_ratio",
    "ours_engine_server": "engine_server_samples_per_s_ratio",
}


def arms(args: argparse.Namespace) -> dict[str, tuple[JobConfig, bool, bool]]:
    """Our sides of the comparison: name → (job, static decoder, on an engine server)."""
    out = {"ours": (job_for(args), True, False)}
    if args.microbatch_tokens:
        out["ours_microbatch"] = (job_for(args, args.microbatch_tokens), True, False)
    if args.whole_rows:
        out["ours_whole_rows"] = (job_for(args, shared_prefix=False), True, False)
    out["ours_dynamic"] = (job_for(args), False, False)
    if args.engine_server:
        out["ours_engine_server"] = (job_for(args, max_staleness=1), True, True)
    return out


def summarise(args: argparse.Namespace, results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    samples = args.prompts * args.group
    summary: dict[str, Any] = {
        "samples_per_step": samples,
        "steps": args.steps,
        "repeats": args.repeats,
        "preset": args.preset,
        "max_new_tokens": args.max_new_tokens,
        "max_staleness": args.max_staleness,
        "microbatch_tokens": args.microbatch_tokens,
    }
    for side in results:
        step = statistics.median([s for run in results[side] for s in run["step_s"]])
        toks = statistics.fmean(run["generated_tokens_per_step"] for run in results[side])
        summary[side] = {
            "median_step_s": step,
            "samples_per_s": samples / step,
            "generated_tokens_per_sample": toks / samples,
            "generated_tokens_per_s": toks / step,
        }
        if side != "trl":
            summary[side]["phases_s"] = results[side][-1]["phases_s"]
    summary["trl"]["generate_s"] = statistics.fmean(run["generate_s"] for run in results["trl"])
    for side, key in RATIO_KEYS.items():
        if side in results:
            summary[key] = summary[side]["samples_per_s"] / summary["trl"]["samples_per_s"]
    summary["generated_tokens_per_s_ratio"] = (
        summary["ours"]["generated_tokens_per_s"] / summary["trl"]["generated_tokens_per_s"]
    )
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="G: samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument(
        "--max-staleness", type=int, default=0, help="ours: 1 rolls out step s+1 while step s trains"
    )
    ap.add_argument(
        "--microbatch-tokens",
        type=int,
        default=0,
        help="N > 0: also ours with the update in length-sorted micro-batches of at most N padded tokens",
    )
    ap.add_argument("--whole-rows", action="store_true", help="also ours with optim.shared_prefix off")
    ap.add_argument(
        "--engine-server",
        action="store_true",
        help="also ours pipelined (max_staleness 1) with its rollouts on an `mgrpo engine` process",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results/trl"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console()
    job = job_for(args)
    ours = arms(args)
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        start = cached_warmstart(
            job_spec(job).warmstart_config(), cache, single_agent=True
        )  # 0 steps: the preset as built
        results: dict[str, list[dict[str, Any]]] = {side: [] for side in [*ours, "trl"]}
        for r in range(args.repeats):
            for side, (side_job, static, on_server) in ours.items():
                engine_model = start.planner_path if on_server else None
                results[side].append(
                    run_ours(
                        side_job,
                        Path(tmp) / f"{side}-{r}",
                        cache,
                        console,
                        static=static,
                        engine_model=engine_model,
                    )
                )
            results["trl"].append(run_trl(job, start.planner_path, cache, Path(tmp) / f"trl-{r}"))
            console.print(
                f"repeat {r}: "
                + ", ".join(
                    f"{k} {statistics.median(v[-1]['step_s']):.2f} s/step" for k, v in results.items()
                )
            )
    summary = summarise(args, results)
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
