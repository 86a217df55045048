"""The MarsRL warm start: supervised fine-tuning of the tiny solver, verifier and corrector (one model
each) and of one shared model (all three roles' demonstrations), stopped early so RL has room. The
distinct verifier trains longer (`verifier_steps`, 2,000 against 400): with the calculator's values in
its demonstrations it checks steps only after about 1,000 SFT steps, and before that it has learned the
base rate of its verdicts (docs/results.md; the shared model stops with the others).

Demonstrations (`mgrpo.tasks.arithmetic`): the solver writes the correct steps; the verifier reviews a
correct or a corrupted solution (half each) and writes the step-by-step report and the verdict; the
corrector revises a corrupted solution given its report into the correct one. One tokenizer serves
all models; the shared model's batch holds one batch of each role (as the three distinct models'
batches together). Cached like the deep-research warm start: `cache_dir/marsrl-<key>`, the key covering
the config and everything else that changes the result (`mgrpo.reproducibility`).
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mgrpo.agents.agents import TurnAgent, demo_transcript
from mgrpo.batching import collate, sft_step
from mgrpo.engines.hf import HFEngine
from mgrpo.models import build_model, save, train_tokenizer
from mgrpo.presets import PRESETS
from mgrpo.records import Transcript
from mgrpo.reproducibility import cache_key, provenance
from mgrpo.tasks.arithmetic import (
    Problem,
    check_steps,
    corrector_prompt,
    corrupt,
    make_problems,
    parse_turn,
    solution_turn,
    solver_prompt,
    tokenizer_texts,
    verification_turn,
    verifier_prompt,
)
from mgrpo.workflows import shipped
from mgrpo.workflows.deep_research_warmstart import build_once
from mgrpo.workflows.marsrl import LocalRun, evaluate
from mgrpo.workflows.spec import JobSpec, stop_check

EVAL_SEED = 1000
ROLES = ("solver", "verifier", "corrector")


@dataclass(frozen=True)
class MarsWarmstartConfig:
    seed: int = 0
    solver_preset: str = "tiny"
    verifier_preset: str = "tiny-wide"
    corrector_preset: str = "tiny"
    shared_preset: str = "tiny"
    vocab: int = 320
    steps: int = 400  # early stop: the solver's held-out accuracy lands in the 15-50 % band (README)
    calculator: bool = True  # the verifier reads each step with its calculator value (MarsRLConfig)
    verifier_steps: int = 2000  # the verifier's own SFT steps: it starts to check after about 1,000
    corrector_steps: int = 2000  # the corrector's: after 400 it fixed 5 % of wrong solutions, 2,000 50 %
    batch_size: int = 32
    lr: float = 3e-3
    n_ops: int = 2
    eval_problems: int = 100  # 0 skips the evaluation

    def presets(self) -> dict[str, object]:
        return {p: PRESETS.get(p) for p in sorted({self.preset(m) for m in (*ROLES, "shared")})}

    def key(self) -> str:
        return cache_key(asdict(self), presets=self.presets())

    def preset(self, model: str) -> str:
        return str(getattr(self, f"{model}_preset"))

    @property
    def total_steps(self) -> int:
        """Steps of the build: the longest-training role's."""
        return max(self.steps, self.verifier_steps, self.corrector_steps)

    def steps_of(self, role: str) -> int:
        """SFT steps of this role's own model (the shared model takes `steps`)."""
        return {"verifier": self.verifier_steps, "corrector": self.corrector_steps}.get(role, self.steps)


@dataclass
class MarsWarmstart:
    folder: Path
    metrics: dict[str, dict[str, float]]
    cached: bool

    def path(self, model: str) -> Path:
        """`solver`, `verifier`, `corrector` or `shared`."""
        return self.folder / model


def demo(
    role: str, p: Problem, tok: PreTrainedTokenizerFast, rng: random.Random, calculator: bool = False
) -> Transcript:
    good = p.steps()
    if role == "solver":
        prompt, turn = solver_prompt(p.text), solution_turn(good)
    else:
        bad = corrupt(p, rng)
        shown = parse_turn(solution_turn(bad)).shown()
        if role == "verifier":
            steps = good if rng.random() < 0.5 else bad
            prompt = verifier_prompt(p.text, parse_turn(solution_turn(steps)).shown(), calculator)
            turn = verification_turn(*check_steps(p, steps, calculator))
        else:
            report = check_steps(p, bad, calculator)[0]
            prompt, turn = corrector_prompt(p.text, shown, report), solution_turn(good)
    ids = list(tok.encode(prompt, add_special_tokens=False))
    return demo_transcript(tok, ids, [(turn, None)], "tool_response")


def run_warmstart(
    cfg: MarsWarmstartConfig, out: Path, *, on_step: Callable[[int, dict[str, float]], None] | None = None
) -> MarsWarmstart:
    torch.manual_seed(cfg.seed)
    tok = train_tokenizer(tokenizer_texts(cfg.seed), cfg.vocab)
    models = {m: build_model(cfg.preset(m), tok, seed=cfg.seed + i) for i, m in enumerate((*ROLES, "shared"))}
    opts = {m: torch.optim.AdamW(model.parameters(), lr=cfg.lr) for m, model in models.items()}
    problems = make_problems("train", 3000, seed=cfg.seed, n_ops=cfg.n_ops)
    rng = random.Random(cfg.seed)
    for step in range(cfg.total_steps):
        losses = {}
        for role in ROLES:
            if step >= cfg.steps_of(role):
                continue
            batch = [demo(role, p, tok, rng, cfg.calculator) for p in rng.sample(problems, cfg.batch_size)]
            losses[f"{role}/sft_loss"] = _sft(models[role], opts[role], tok, batch)
        if step < cfg.steps:
            mixed = [
                demo(role, p, tok, rng, cfg.calculator)
                for role in ROLES
                for p in rng.sample(problems, cfg.batch_size)
            ]
            losses["shared/sft_loss"] = _sft(models["shared"], opts["shared"], tok, mixed)
        if on_step:
            on_step(step, losses)
    metrics = (
        evaluate_models(cfg, {r: (models[r], tok) for r in ROLES}, (models["shared"], tok))
        if cfg.eval_problems
        else {}
    )
    out.mkdir(parents=True, exist_ok=True)
    for m, model in models.items():
        save(model, tok, out / m)
    (out / "config.json").write_text(json.dumps(provenance(asdict(cfg), presets=cfg.presets()), indent=2))
    (out / "eval.json").write_text(json.dumps(metrics, indent=2))
    return MarsWarmstart(out, metrics, cached=False)


def _sft(
    model: PreTrainedModel, opt: torch.optim.Optimizer, tok: PreTrainedTokenizerFast, demos: list[Transcript]
) -> float:
    return sft_step(model, opt, collate(demos, int(tok.pad_token_id)))


def evaluate_models(
    cfg: MarsWarmstartConfig,
    distinct: dict[str, tuple[PreTrainedModel, PreTrainedTokenizerFast]],
    shared: tuple[PreTrainedModel, PreTrainedTokenizerFast] | None = None,
    *,
    temperature: float = 1.0,
    n_problems: int | None = None,
) -> dict[str, dict[str, float]]:
    """The V–C evaluation (`marsrl.evaluate`) on the same seeded held-out problems, for the three
    distinct models and, when given, the shared one."""
    problems = make_problems(
        "heldout", n_problems or cfg.eval_problems, seed=1000 + cfg.seed, n_ops=cfg.n_ops
    )
    out = {"distinct": evaluate_system(problems, distinct, temperature, calculator=cfg.calculator)}
    if shared is not None:
        out["shared"] = evaluate_system(
            problems, dict.fromkeys(ROLES, shared), temperature, calculator=cfg.calculator
        )
    return out


def evaluate_system(
    problems: list[Problem],
    models: dict[str, tuple[PreTrainedModel, PreTrainedTokenizerFast]],
    temperature: float = 1.0,
    outcomes: dict[str, list[float]] | None = None,
    on_done: Callable[[], None] | None = None,
    *,
    calculator: bool = False,
) -> dict[str, float]:
    """The V–C loop of these models on held-out problems (`mgrpo.workflows.marsrl.evaluate`;
    `on_done` after each problem; `calculator`: as the verifier was trained)."""
    engines: dict[int, HFEngine] = {}
    agents = {}
    for role, (model, tok) in models.items():
        engine = engines.setdefault(id(model), HFEngine(model, tok))
        agents[role] = TurnAgent(engine, tok, temperature=temperature)
    try:
        run = LocalRun(agents, seed=EVAL_SEED)
        return evaluate(problems, run, calculator=calculator, outcomes=outcomes, on_done=on_done)
    finally:
        for e in engines.values():
            e.close()


def cached_warmstart(
    cfg: MarsWarmstartConfig,
    cache_dir: Path,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> MarsWarmstart:
    """The shipped warm start of this config when there is one (`mgrpo.workflows.shipped`), else reuse
    `cache_dir/marsrl-<key>` when it holds a finished one, else run and store one."""
    found = shipped.find("marsrl", asdict(cfg), cfg.presets())
    if found is not None:
        return MarsWarmstart(found, json.loads((found / "eval.json").read_text()), cached=True)
    folder = cache_dir / f"marsrl-{cfg.key()}"
    metrics, cached = build_once(folder, lambda tmp: run_warmstart(cfg, tmp, on_step=on_step).metrics)
    return MarsWarmstart(folder, metrics, cached=cached)


class MarsRLWarmStart:
    """MarsRL's `WarmStart` (`mgrpo.workflows.spec`): one model per role and a shared one, on one
    tokenizer. A root whose model other roles share starts from the shared model."""

    title = "MarsRL warm start"

    def config(self, job: JobSpec) -> MarsWarmstartConfig:
        default = MarsWarmstartConfig()
        given = job.cfg.warmstart_steps  # every model that many steps, else each role's default
        steps = default.steps if given is None else given
        solver, verifier, corrector = (job.model_of(r).preset or default.preset(r) for r in ROLES)
        return MarsWarmstartConfig(
            seed=job.cfg.seed,
            steps=steps,
            n_ops=job.cfg.marsrl.n_ops,
            calculator=job.cfg.marsrl.calculator,
            verifier_steps=default.verifier_steps if given is None else given,
            corrector_steps=default.corrector_steps if given is None else given,
            solver_preset=solver,
            verifier_preset=verifier,
            corrector_preset=corrector,
            shared_preset=solver,
            eval_problems=100 if steps >= 100 else 0,
        )

    def steps(self, config: MarsWarmstartConfig) -> int:
        return config.total_steps

    def eval_rollouts(self, config: MarsWarmstartConfig) -> int:
        return 0

    def build(
        self,
        config: MarsWarmstartConfig,
        cache_dir: Path,
        *,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        on_eval: Callable[[], None] | None = None,
    ) -> MarsWarmstart:
        return cached_warmstart(config, cache_dir, on_step=on_step)

    def source(self, job: JobSpec, role: str, cache_dir: Path, *, stop: threading.Event | None = None) -> str:
        shared = role == job.root and len(job.root_roles) > 1
        built = self.build(self.config(job), cache_dir, on_step=stop_check(stop))
        return str(built.path("shared" if shared else role))

    def evaluated_on(self, config: MarsWarmstartConfig, n: int) -> MarsWarmstartConfig:
        return replace(config, eval_problems=n)

    def summary(self, built: MarsWarmstart) -> list[str]:
        return [
            f"{name} solver {m['solver_accuracy']:.2f}  V–C system {m['system_accuracy']:.2f}  verifier balanced "
            f"accuracy {m['verifier_balanced_accuracy']:.2f}  corrector fixes {m['corrector_fix_rate']:.2f}, "
            f"breaks {m['corrector_break_rate']:.2f}"
            for name, m in built.metrics.items()
        ]


WARMSTART = MarsRLWarmStart()
