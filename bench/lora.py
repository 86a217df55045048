"""LoRA roles against full fine-tuning (issue 39), side by side in one run.

    .venv/bin/python bench/lora.py --costs                  # per-update costs, tiny and small presets (~1 min)
    .venv/bin/python bench/lora.py --demos 2                # + the demo twice each way, interleaved (~20 min)
    .venv/bin/python bench/lora.py --demos 1 --arms lora hosted   # two adapters: two services, or one base

Costs (`--costs`): one role's `RoleModel` on a saved preset, full weights and a rank-8 all-linear
adapter, the same 16 sampled rows each update: the update's median seconds over `--updates`, the
weight sync to the engine (full: the push of every tensor into the engine's own copy; LoRA: the
merge into the served copy plus that push), what the optimizer holds (parameters and state bytes),
the checkpoint's bytes, and the decode throughput of the served model merged (the static decoder)
against the peft model unmerged (the HF forward with its dynamic cache; the static decoder cannot
read an unmerged adapter): 64 prompts × 32 new tokens.

Learning (`--demos N`): `mgrpo demo` N times per arm, alternating, each on its own run folder: `full`
(its defaults), `lora` (`--lora 8 --lr 1e-3`: each role its adapter on its own warm start, two
services) and, when named in `--arms`, `hosted` (`--shared --lora 8 --lr 1e-3`: the sub-agent hosted in
the planner's service, both adapters on the shared warm start, whose own "before" is its own);
each run's held-out success before and after, gain and paired SE from its eval.json.

Writes `results.json` into `--out`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from mgrpo.config import JobConfig
from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.models import build_model, save, train_tokenizer
from mgrpo.records import Sample, Transcript
from mgrpo.role_model import RoleModel
from mgrpo.runtime import Placement
from mgrpo.workflows import job_spec

LORA = {"rank": 8, "alpha": 16, "target_modules": "all-linear"}


def _tree_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _rows(m: RoleModel, n: int) -> list[Sample]:
    ids = m.tokenizer.encode("who was born in the town of", add_special_tokens=False)
    outs = m.engine.generate([ids] * n, SamplingParams(max_new_tokens=24, seed=0))
    return [
        Sample(
            "planner",
            f"g{i // 8}",
            Transcript(
                ids + s.token_ids,
                [0.0] * len(ids) + s.logprobs,
                [0] * len(ids) + [1] * len(s.token_ids),
                len(ids),
            ),
            0.0,
            advantage=1.0 if i % 2 else -1.0,
            policy_version=m.version,
        )
        for i, s in enumerate(outs)
    ]


def _decode_tps(model: Any, tokenizer: Any, static: bool) -> float:
    engine = HFEngine(model, tokenizer, static_cache=static)
    try:
        prompts = [tokenizer.encode(f"who was born in town {i}", add_special_tokens=False) for i in range(64)]
        params = SamplingParams(max_new_tokens=32, seed=0)
        engine.generate(prompts[:8], params)  # warm-up
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
        return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)
    finally:
        engine.close()


def costs(preset: str, updates: int, work: Path) -> dict[str, Any]:
    tok = train_tokenizer([f"who was born in the town of {i} {i * 7}" for i in range(200)])
    folder = save(build_model(preset, tok, seed=0), tok, work / preset / "base")
    out: dict[str, Any] = {}
    for arm in ("full", "lora"):
        role: dict[str, Any] = {"model": {"path": str(folder)}, "optim": {"lr": 1e-4}}
        if arm == "lora":
            role["lora"] = LORA
        cfg = JobConfig(roles={"planner": role}, max_staleness=1)  # own-weights engine: every update pushes
        placement = Placement(cache_dir=work, checkpoint_dir=work / preset / arm)
        m = RoleModel(job_spec(cfg), "planner", placement=placement, job_id="bench", last_step=-1)
        try:
            rows = _rows(m, 16)
            times, syncs = [], []
            for u in range(updates):
                for s in rows:
                    s.policy_version = m.version
                t0 = time.perf_counter()
                metrics = m.update(rows, seed=u)
                times.append(time.perf_counter() - t0)
                t1 = time.perf_counter()
                assert isinstance(m.engine, HFEngine)
                m.engine.push_weights(m.served, m.version)  # the push alone, timed (update() also pushed)
                syncs.append(metrics.get("weight_sync_s", 0.0) + time.perf_counter() - t1)
            held = [p for g in m.optimizer.param_groups for p in g["params"]]
            state = sum(
                t.numel() * t.element_size()
                for st in m.optimizer.state.values()
                for t in st.values()
                if torch.is_tensor(t)
            )
            ckpt = m.save(updates)
            row = {
                "update_s_median": statistics.median(times[1:] or times),
                "sync_s_median": statistics.median(syncs[1:] or syncs),
                "trained_params": sum(p.numel() for p in held),
                "model_params": sum(p.numel() for p in m.served.parameters()),
                "optimizer_state_bytes": state,
                "checkpoint_bytes": _tree_bytes(ckpt.path),
            }
            if arm == "lora":
                assert m.adapter is not None
                row["adapter_bytes"] = m.adapter.bytes
                row["decode_tok_s_merged"] = _decode_tps(m.adapter.merged, m.tokenizer, static=True)
                row["decode_tok_s_unmerged"] = _decode_tps(m.adapter.peft, m.tokenizer, static=False)
                row["decode_tok_s_merged_dynamic"] = _decode_tps(m.adapter.merged, m.tokenizer, static=False)
            out[arm] = row
        finally:
            m.close()
    return out


def demos(n: int, work: Path, cache_dir: Path, arms: list[str]) -> list[dict[str, Any]]:
    from services.demo import DemoOptions, run_demo  # the demo's own code path, as `mgrpo demo` runs it

    options_of = {
        "full": DemoOptions(cache_dir=cache_dir),
        "lora": DemoOptions(cache_dir=cache_dir, lora=8, lr=1e-3),
        "hosted": DemoOptions(cache_dir=cache_dir, lora=8, lr=1e-3, shared=True),
    }
    console = Console()
    runs = []
    for i in range(n):
        for arm, options in ((a, options_of[a]) for a in arms):
            t0 = time.perf_counter()
            result = run_demo(work / f"demo-{i}-{arm}", options, console)
            gain = result["gain"]
            runs.append(
                {
                    "round": i,
                    "arm": arm,
                    "before": gain["before"],
                    "after": gain["after"],
                    "gain": gain["gain"],
                    "se": gain["se"],
                    "wall_s": time.perf_counter() - t0,
                }
            )
            console.print(runs[-1])
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--costs", action="store_true")
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--updates", type=int, default=5)
    ap.add_argument("--demos", type=int, default=0, help="demo runs per arm (0: none)")
    ap.add_argument("--arms", nargs="+", choices=["full", "lora", "hosted"], default=["full", "lora"])
    ap.add_argument("--out", type=Path, default=Path("bench/results/lora"))
    ap.add_argument("--cache-dir", type=Path, default=Path(".cache/mgrpo"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d")}
    if args.costs:
        result["costs"] = {p: costs(p, args.updates, args.out / "work") for p in args.presets}
        print(json.dumps(result["costs"], indent=2))
    if args.demos:
        result["demos"] = demos(args.demos, args.out, args.cache_dir, args.arms)
    (args.out / "results.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
