"""hf engine throughput (issues 4 and 18): 64 concurrent episodes through `HFEngine` (static and
dynamic decoders) vs per-request `model.generate` vs one batched `model.generate` of the same prompts,
and one decode step of each decoder against the machine's two floors, in one run.

    .venv/bin/python bench/engine_bench.py [--preset tiny] [--concurrency 64] [--new-tokens 48]

The engines and `generate` sample at temperature 1 (top-k off) with EOS disabled, so every request
makes exactly `--new-tokens` tokens; tokens/s of each and the ratios. The decode step: `--concurrency`
rows at a context of `--context` tokens, median of 64 steps per decoder; its floors are the step's
FLOPs (every weight matrix once per row, plus attention over the context) at the measured fp32
matmul peak, and its bytes (the weights and the K/V it reads) at the measured copy bandwidth. One
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.decoders import make_decoder
from mgrpo.engines.hf import HFEngine
from mgrpo.evaluation import System, evaluate
from mgrpo.models import build_model, load, n_params, train_tokenizer
from mgrpo.tasks.deep_research import DeepResearchTask, make_questions
from mgrpo.workflows.deep_research_eval import EVAL_SEED, heldout_questions, majority_baseline
from mgrpo.workflows.deep_research_warmstart import WarmstartConfig, cached_warmstart, make_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.mfu import matmul_peak

STATIC_CACHE = {"static": True, "dynamic": False}  # the two KV-cache kinds the bench compares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--context", type=int, default=128, help="tokens in each row's cache at the decode step")
    ap.add_argument(
        "--episodes",
        type=int,
        default=64,
        help="held-out questions the warm-started planner + sub-agent answer on each decoder (0: skip; "
        "builds the default warm start into --cache-dir when it is not there)",
    )
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    args = ap.parse_args()
    torch.manual_seed(0)
    task = DeepResearchTask()
    tok = train_tokenizer([d.text for d in task.world.docs], 320)
    model = build_model(args.preset, tok).eval()
    model.generation_config.eos_token_id = None  # every request makes exactly --new-tokens
    prompts = [
        tok.encode(f"Q: {q.text}\n", add_special_tokens=False)
        for q in make_questions(task.world, "train", 2, args.concurrency)
    ]
    n_tokens = args.concurrency * args.new_tokens
    best = best_times(model, tok, prompts, args)
    tps = {k: n_tokens / v for k, v in best.items()}
    step = {
        kind: decode_step_s(model, STATIC_CACHE[kind], args.concurrency, args.context)
        for kind in ("static", "dynamic")
    }
    floors = decode_floors(model, args.concurrency, args.context)
    multi_turn = episodes(args.episodes, args.cache_dir, args.repeats) if args.episodes else {}
    print(
        json.dumps(
            {
                "preset": args.preset,
                "params": n_params(model),
                "concurrency": args.concurrency,
                "new_tokens": args.new_tokens,
                "static_engine_tok_s": round(tps["static"]),
                "dynamic_engine_tok_s": round(tps["dynamic"]),
                "per_request_generate_tok_s": round(tps["per_request"]),
                "batched_generate_tok_s": round(tps["batched"]),
                "static_vs_dynamic": round(tps["static"] / tps["dynamic"], 2),
                "static_vs_batched": round(tps["static"] / tps["batched"], 2),
                "dynamic_vs_batched": round(tps["dynamic"] / tps["batched"], 2),
                "context": args.context,
                **floors,
                **{f"{k}_step_ms": round(v * 1e3, 3) for k, v in step.items()},
                **{f"{k}_step_vs_flop_floor": round(v / floors["flop_floor_s"], 1) for k, v in step.items()},
                **{
                    f"{k}_step_vs_memory_floor": round(v / floors["memory_floor_s"], 1)
                    for k, v in step.items()
                },
                **multi_turn,
            }
        )
    )


def episodes(n: int, cache_dir: Path, repeats: int) -> dict[str, float]:
    """The real multi-turn workload: the warm-started planner and sub-agent answer `n` held-out
    questions (seeded, T = 1) on each decoder; best-of-`repeats` wall seconds, and the prompt tokens the
    engines admitted and prefilled (the rest came from the cache)."""
    cfg = WarmstartConfig()
    task, warm = make_task(cfg), cached_warmstart(cfg, cache_dir)
    planner, subagent = load(warm.planner_path), load(warm.subagent_path)
    questions, majority = heldout_questions(task, cfg, 2, n), majority_baseline(task)
    out: dict[str, float] = {"episodes": n}
    for _ in range(repeats):
        for kind in ("static", "dynamic"):
            os.environ["MGRPO_HF_STATIC_CACHE"] = str(int(STATIC_CACHE[kind]))
            system = System.build(task, planner, subagent, temperature=1.0, seed=EVAL_SEED)
            t0 = time.perf_counter()
            success = evaluate(system, questions, majority)["success"]
            wall = time.perf_counter() - t0
            engines = (system.planner_engine, system.subagent_engine)
            system.close()
            out[f"{kind}_episodes_s"] = min(out.get(f"{kind}_episodes_s", 1e9), round(wall, 2))
            out[f"{kind}_episodes_success"] = success
            out[f"{kind}_prompt_tokens"] = sum(e.prompt_tokens for e in engines)
            out[f"{kind}_prefilled_tokens"] = sum(e.prefilled_tokens for e in engines)
    os.environ.pop("MGRPO_HF_STATIC_CACHE")
    out["static_vs_dynamic_episodes"] = round(out["dynamic_episodes_s"] / out["static_episodes_s"], 2)
    return out


def best_times(model: Any, tok: Any, prompts: list[list[int]], args: argparse.Namespace) -> dict[str, float]:
    """Best-of-`repeats` seconds of each arm on the same prompts (interleaved)."""
    engines = {
        kind: HFEngine(model, tok, max_batch=args.concurrency, gather_ms=20, static_cache=STATIC_CACHE[kind])
        for kind in ("static", "dynamic")
    }
    for engine in engines.values():
        engine.eos_id = None
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    gen_kwargs = dict(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        pad_token_id=tok.pad_token_id,
    )
    best = {"static": 1e9, "dynamic": 1e9, "per_request": 1e9, "batched": 1e9}
    for _ in range(args.repeats):
        for kind, engine in engines.items():
            best[kind] = min(best[kind], run_engine(engine, prompts, params))
        best["per_request"] = min(best["per_request"], run_per_request(model, prompts, gen_kwargs))
        best["batched"] = min(best["batched"], run_batched(model, tok, prompts, gen_kwargs))
    for engine in engines.values():
        engine.close()
    return best


def run_engine(engine: HFEngine, prompts: list[list[int]], params: SamplingParams) -> float:
    """Every prompt from its own thread, all released at once."""
    barrier = threading.Barrier(len(prompts))
    lens: list[int] = []

    def one(p: list[int]) -> None:
        barrier.wait()
        lens.append(len(engine.generate([p], params)[0].token_ids))

    threads = [threading.Thread(target=one, args=(p,)) for p in prompts]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(lens) == len(prompts) * params.max_new_tokens, sum(lens)
    return time.perf_counter() - t0


@torch.no_grad()
def run_per_request(model: Any, prompts: list[list[int]], gen_kwargs: dict[str, Any]) -> float:
    t0 = time.perf_counter()
    for p in prompts:
        model.generate(
            torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), **gen_kwargs
        )
    return time.perf_counter() - t0


@torch.no_grad()
def run_batched(model: Any, tok: Any, prompts: list[list[int]], gen_kwargs: dict[str, Any]) -> float:
    enc = tok.pad({"input_ids": prompts}, return_tensors="pt", padding_side="left")
    t0 = time.perf_counter()
    out = model.generate(enc["input_ids"], attention_mask=enc["attention_mask"], **gen_kwargs)
    assert out.shape[1] - enc["input_ids"].shape[1] == gen_kwargs["max_new_tokens"]
    return time.perf_counter() - t0


def decode_step_s(model: torch.nn.Module, static: bool, rows: int, context: int, steps: int = 64) -> float:
    """Median seconds of one decode step of `rows` rows whose caches hold about `context` tokens."""
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    decoder = make_decoder(model, 0, static=static)
    decoder.admit(
        [torch.randint(1, vocab, (context - steps // 2,), generator=g).tolist() for _ in range(rows)]
    )
    tokens = torch.randint(1, vocab, (rows,), generator=g)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        decoder.step(tokens)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def decode_floors(model: torch.nn.Module, rows: int, context: int) -> dict[str, float]:
    """A decode step's FLOPs and bytes, and their times at this machine's measured peaks."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads)
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n)
    if cfg.tie_word_embeddings:
        matrices += model.get_input_embeddings().weight.numel()  # the tied lm_head
    attention = 4 * cfg.num_hidden_layers * cfg.num_attention_heads * head_dim * context  # QK^T and AV
    flops = rows * (2 * matrices + attention)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_bytes = rows * context * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 4
    peak = max(matmul_peak().values()) * 1e9
    bandwidth = copy_bandwidth()
    return {
        "step_mflop": round(flops / 1e6, 1),
        "step_mb_read": round((weight_bytes + kv_bytes) / 1e6, 2),
        "matmul_peak_gflops_per_s": round(peak / 1e9, 1),
        "copy_gb_per_s": round(bandwidth / 1e9, 1),
        "flop_floor_s": flops / peak,
        "memory_floor_s": (weight_bytes + kv_bytes) / bandwidth,
    }


def copy_bandwidth(n_bytes: int = 1 << 28, repeats: int = 5) -> float:
    """Bytes per second read by a large tensor copy (best of `repeats`; a copy reads and writes each byte)."""
    src = torch.ones(n_bytes // 4)
    dst = torch.empty_like(src)
    best = 1e9
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * n_bytes / best


if __name__ == "__main__":
    main()
