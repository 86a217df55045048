"""Warm start (`mgrpo warmstart`): supervised fine-tuning of the tiny planner and sub-agent on
generated demonstrations, stopped early so the untrained system is only partly competent.

RL needs headroom: a fully fine-tuned tiny model leaves M-GRPO nothing to do, so the number of
steps is chosen (and documented in the README with the measured evaluation) to leave stage-2
held-out success at temperature 1 between roughly 10 % and 50 % (greedy above the majority-answer
baseline). The result is cached on disk, keyed by the config and everything else that changes it
(`mgrpo.reproducibility`), and reused; the same seed gives the same weights, bit for bit, on every
machine of a kind. Also `single_agent`: one model that has the sub-agent's tools itself, for the
paper's single-agent baseline.
"""

from __future__ import annotations

import fcntl
import json
import random
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mgrpo.batching import length_sorted_chunks, sft_step_chunked
from mgrpo.config import JobConfig
from mgrpo.models import build_model, load, save, train_tokenizer
from mgrpo.presets import PRESETS
from mgrpo.records import Transcript
from mgrpo.reproducibility import cache_key, provenance
from mgrpo.tasks.deep_research import DeepResearchTask, Question, make_questions, team_role
from mgrpo.tasks.demos import (
    comparer_demo,
    guessed,
    planner_demo,
    single_agent_demo,
    subagent_demo,
    subtasks_of,
)
from mgrpo.tasks.world import generate_world
from mgrpo.workflows import shipped
from mgrpo.workflows.deep_research_eval import evaluate_single_model, evaluate_system
from mgrpo.workflows.spec import JobSpec, stop_check


@dataclass(frozen=True)
class WarmstartConfig:
    seed: int = 0
    n_people: int = 2000
    planner_preset: str = "tiny"
    subagent_preset: str = "tiny-wide"
    planner_vocab: int = 320
    subagent_vocab: int = 352
    steps: int = 350  # early stop: stage-2 held-out success at T = 1 lands in the 10-50 % band (README)
    batch_size: int = 64
    lr: float = 3e-3
    stage2_fraction: float = 0.5
    eval_questions: int = 100  # 0 skips the evaluation
    sft_chunks: int = 4  # each SFT batch as length-sorted chunks (less padding; the same token-mean loss)
    guess_share: float = 0.0  # a flawed demonstrator: this share of subtasks guessed (`guessed`)
    planner_sees_guesses: bool = False  # the planner's demos go on from the sub-agent's guesses

    def as_dict(self) -> dict[str, Any]:
        """The config as its cache key and shipped manifest read it: a field added after warm starts
        were shipped appears only when it is not its default, so their keys stay valid."""
        out = asdict(self)
        for name, default in _ADDED_FIELDS.items():
            if out[name] == default:
                del out[name]
        return out

    def eval_rollouts(self) -> int:
        """Planner rollouts of the warm start's own evaluation (2 stages x 2 temperatures)."""
        return 4 * self.eval_questions

    def presets(self) -> dict[str, object]:
        return {p: PRESETS.get(p) for p in sorted({self.planner_preset, self.subagent_preset, "tiny"})}

    def key(self) -> str:
        return cache_key(self.as_dict(), presets=self.presets())

    def provenance(self) -> str:
        return json.dumps(provenance(self.as_dict(), presets=self.presets()), indent=2)


_ADDED_FIELDS: dict[str, object] = {"guess_share": 0.0, "planner_sees_guesses": False}


@dataclass
class WarmstartResult:
    folder: Path
    planner_path: Path
    subagent_path: Path
    metrics: dict[str, dict[str, float]]
    cached: bool


def make_task(cfg: WarmstartConfig) -> DeepResearchTask:
    return DeepResearchTask(generate_world(cfg.seed, n_people=cfg.n_people))


def job_task(cfg: JobConfig) -> DeepResearchTask:
    """A deep-research job's task: the built-in world of its seed and size (its warm start's world)."""
    return DeepResearchTask(generate_world(cfg.seed, n_people=cfg.n_people))


def tokenizer_texts(task: DeepResearchTask) -> list[str]:
    """Tokenizers see only text that does not name a held-out person."""
    held = set(task.world.heldout_people)
    qs = make_questions(task.world, "train", 1, 300) + make_questions(task.world, "train", 2, 300)
    return [d.text for d in task.world.docs if d.title not in held] + [q.text for q in qs]


def _train_questions(task: DeepResearchTask, cfg: WarmstartConfig) -> list[Question]:
    n2 = int(4000 * cfg.stage2_fraction)
    return make_questions(task.world, "train", 1, 4000 - n2, seed=cfg.seed + 1) + make_questions(
        task.world, "train", 2, n2, seed=cfg.seed + 1
    )


class PairTraining:
    """The SFT run of `cfg`'s planner and sub-agent, advanced in parts: the learning rate is constant
    and the batches one seeded draw, so `advance(n)` then `save` gives the same weights, bit for bit,
    as a warm start built alone with `steps = n`, whatever was saved before (`cached_ladder`).

    `shared`: one model (the planner's preset, the larger vocabulary) learns both roles' batches, one
    SFT step each per step with one optimizer: the base a sub-agent hosted on the planner's base
    (`JobSpec.hosted_callees`) shares, each role then training an adapter of its own on it."""

    def __init__(self, cfg: WarmstartConfig, *, shared: bool = False) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg, self.task, self.done, self.shared = cfg, make_task(cfg), 0, shared
        texts = tokenizer_texts(self.task)
        if shared:
            self.ptok = self.stok = train_tokenizer(texts, max(cfg.planner_vocab, cfg.subagent_vocab))
            self.pm = self.sm = build_model(cfg.planner_preset, self.ptok, seed=cfg.seed)
            self.popt = self.sopt = torch.optim.AdamW(self.pm.parameters(), lr=cfg.lr)
        else:
            self.ptok, self.stok = (
                train_tokenizer(texts, cfg.planner_vocab),
                train_tokenizer(texts, cfg.subagent_vocab),
            )
            self.pm = build_model(cfg.planner_preset, self.ptok, seed=cfg.seed)
            self.sm = build_model(cfg.subagent_preset, self.stok, seed=cfg.seed + 1)
            self.popt = torch.optim.AdamW(self.pm.parameters(), lr=cfg.lr)
            self.sopt = torch.optim.AdamW(self.sm.parameters(), lr=cfg.lr)
        self.questions = _train_questions(self.task, cfg)
        self.rng = random.Random(cfg.seed)
        self.p_demos: dict[str, Transcript] = {}  # demonstrations are deterministic: build each once
        self.s_demos: dict[str, Transcript] = {}

    def advance(self, steps: int, on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        """Train on until `steps` SFT steps are done in all."""
        task, cfg = self.task, self.cfg
        for step in range(self.done, steps):
            qs = self.rng.sample(self.questions, cfg.batch_size)
            subs = self.rng.sample(subtasks_of(task, qs), cfg.batch_size)
            p_batch = [
                self.p_demos.get(q.qid) or self.p_demos.setdefault(q.qid, self._planner_demo(q)) for q in qs
            ]
            s_batch = [
                self.s_demos.get(s) or self.s_demos.setdefault(s, self._subagent_demo(s)) for s in subs
            ]
            p_loss = _sft(self.pm, self.popt, self.ptok, p_batch, cfg)
            s_loss = _sft(self.sm, self.sopt, self.stok, s_batch, cfg)
            self.done = step + 1
            if on_step:
                on_step(step, {"planner/sft_loss": p_loss, "subagent/sft_loss": s_loss})

    def _guess(self, subtask: str) -> str | None:
        return guessed(self.task, subtask, self.cfg.guess_share, self.cfg.seed)

    def _planner_demo(self, q: Question) -> Transcript:
        told = self._guess if self.cfg.planner_sees_guesses else None
        return planner_demo(self.task, self.ptok, q, told=told)

    def _subagent_demo(self, subtask: str) -> Transcript:
        return subagent_demo(self.task, self.stok, subtask, guess=self._guess(subtask))

    def save(self, out: Path, on_eval: Callable[[], None] | None = None) -> WarmstartResult:
        """Evaluate and save the models as the warm start of `self.done` steps (its own config)."""
        cfg = replace(self.cfg, steps=self.done)
        with torch.random.fork_rng():  # training after an evaluation draws as if there were none
            pair = (self.pm, self.ptok), (self.sm, self.stok)
            metrics = evaluate_system(self.task, *pair, cfg, on_done=on_eval) if cfg.eval_questions else {}
        out.mkdir(parents=True, exist_ok=True)
        save(self.pm, self.ptok, out / "planner")
        if not self.shared:
            save(self.sm, self.stok, out / "subagent")
        (out / "config.json").write_text(cfg.provenance())
        (out / "eval.json").write_text(json.dumps(metrics, indent=2))
        sub = out / ("planner" if self.shared else "subagent")
        return WarmstartResult(out, out / "planner", sub, metrics, cached=False)


def run_warmstart(
    cfg: WarmstartConfig,
    out: Path,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    on_eval: Callable[[], None] | None = None,
    shared: bool = False,
) -> WarmstartResult:
    """Train both models (`shared`: one model for both roles) from scratch on demonstrations; save
    them and their evaluation to `out` (`on_step` after each SFT step, `on_eval` after each of the
    evaluation's `eval_rollouts()`)."""
    training = PairTraining(cfg, shared=shared)
    training.advance(cfg.steps, on_step)
    return training.save(out, on_eval)


def cached_ladder(
    cfg: WarmstartConfig,
    ladder: Sequence[int],
    cache_dir: Path,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> Iterator[WarmstartResult]:
    """The (planner, sub-agent) warm starts of `cfg` with `ladder`'s rising step counts, each the one
    `cached_warmstart` gives for that many steps, from one SFT run that goes on only while the
    caller asks for the next rung (a plateau search trains the longest rung it needs, not their sum)."""
    if list(ladder) != sorted(set(ladder)):
        raise ValueError(f"a warm-start ladder rises step by step, got {list(ladder)}")
    training: PairTraining | None = None
    for steps in ladder:
        rung = replace(cfg, steps=steps)

        def build(tmp: Path, rung: WarmstartConfig = rung) -> dict[str, Any]:
            nonlocal training
            training = training or PairTraining(rung)
            training.advance(rung.steps, on_step)
            return training.save(tmp).metrics

        yield _cached("warmstart", rung, cache_dir, build)


def _sft(
    model: PreTrainedModel,
    opt: torch.optim.Optimizer,
    tok: PreTrainedTokenizerFast,
    demos: list[Transcript],
    cfg: WarmstartConfig,
) -> float:
    chunks = length_sorted_chunks(demos, int(tok.pad_token_id), min(cfg.sft_chunks, len(demos)))
    return sft_step_chunked(model, opt, chunks)


def cached_warmstart(
    cfg: WarmstartConfig,
    cache_dir: Path,
    *,
    single_agent: bool = False,
    team: bool = False,
    shared: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    on_eval: Callable[[], None] | None = None,
) -> WarmstartResult:
    """The shipped warm start of this config when there is one (`mgrpo.workflows.shipped`), else
    reuse `cache_dir/<kind>-<config key>` when it holds a finished one, else run and store one.
    Kinds: `warmstart` (planner, subagent), `single`, `team` (planner, searcher, comparer), `shared`
    (one model, `planner`, for both roles), `shared_team` (`team` and `shared`: one model for the
    team's three roles)."""
    kind = "single" if single_agent else "team" if team else "shared" if shared else "warmstart"
    kind = "shared_team" if team and shared else kind

    def build(tmp: Path) -> dict[str, Any]:
        if team:
            pair = cached_warmstart(cfg, cache_dir, shared=shared, on_step=on_step)
            return run_team_warmstart(cfg, tmp, pair, on_step=on_step, shared=shared).metrics
        if single_agent:
            return run_single_warmstart(cfg, tmp, on_step=on_step).metrics
        return run_warmstart(cfg, tmp, on_step=on_step, on_eval=on_eval, shared=shared).metrics

    return _cached(kind, cfg, cache_dir, build)


def _cached(
    kind: str, cfg: WarmstartConfig, cache_dir: Path, build: Callable[[Path], dict[str, Any]]
) -> WarmstartResult:
    """The shipped `kind` warm start of `cfg` if there is one, else `cache_dir/<kind>-<key>` built once."""
    names = {
        "single": ("single", "single"),
        "team": ("planner", "searcher"),
        "shared": ("planner", "planner"),
        "shared_team": ("planner", "planner"),
    }.get(kind, ("planner", "subagent"))
    found = shipped.find(kind, cfg.as_dict(), cfg.presets())
    if found is not None:
        metrics = json.loads((found / "eval.json").read_text())
        return WarmstartResult(found, found / names[0], found / names[1], metrics, cached=True)
    folder = cache_dir / f"{kind}-{cfg.key()}"
    metrics, cached = build_once(folder, build)
    return WarmstartResult(folder, folder / names[0], folder / names[1], metrics, cached=cached)


def build_once(folder: Path, build: Callable[[Path], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """A cached build: reuse `folder` when it holds a finished one (its `eval.json`), else `build` into
    `<folder>.partial` and rename it into place, under a file lock (two services on one disk: one
    trains, the other waits and reuses; only a finished build is ever found). Returns (metrics, cached)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with (folder.parent / f"{folder.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "eval.json").exists():
            return json.loads((folder / "eval.json").read_text()), True
        tmp = folder.with_name(folder.name + ".partial")
        metrics = build(tmp)
        tmp.rename(folder)
    return metrics, False


def run_single_warmstart(
    cfg: WarmstartConfig, out: Path, *, on_step: Callable[[int, dict[str, float]], None] | None = None
) -> WarmstartResult:
    """The single-agent baseline's warm start: one model (the planner's preset and tokenizer size) on
    demonstrations where it does every lookup itself (with `guess_share`, the flawed demonstrator's:
    it skips the guessed subtasks' lookups and carries on from the guesses). Same questions, steps
    and optimiser."""
    torch.manual_seed(cfg.seed)
    task = make_task(cfg)
    tok = train_tokenizer(tokenizer_texts(task), cfg.planner_vocab)
    model = build_model(cfg.planner_preset, tok, seed=cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    questions = _train_questions(task, cfg)
    rng = random.Random(cfg.seed)
    for step in range(cfg.steps):
        loss = _sft(
            model,
            opt,
            tok,
            [
                single_agent_demo(task, tok, q, guess_share=cfg.guess_share, seed=cfg.seed)
                for q in rng.sample(questions, cfg.batch_size)
            ],
            cfg,
        )
        if on_step:
            on_step(step, {"single/sft_loss": loss})

    metrics = evaluate_single_model(task, (model, tok), cfg) if cfg.eval_questions else {}
    out.mkdir(parents=True, exist_ok=True)
    save(model, tok, out / "single")
    (out / "config.json").write_text(cfg.provenance())
    (out / "eval.json").write_text(json.dumps(metrics, indent=2))
    return WarmstartResult(out, out / "single", out / "single", metrics, cached=False)


def run_team_warmstart(
    cfg: WarmstartConfig,
    out: Path,
    base: WarmstartResult,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    shared: bool = False,
) -> WarmstartResult:
    """The team variant's warm start, on top of the deep-research one (`base`): the searcher is its
    sub-agent (the same demonstrations), copied; the planner continues from its planner for a third
    of the steps on the team plans (lookups, then the comparison of a comparison question delegated);
    the comparer (`tiny`, the sub-agent's tokenizer) learns to call `compare` and answer in as many
    steps. Same questions, batch and optimiser; no held-out evaluation. `shared`: `base` is the one
    model of both roles (`PairTraining(shared=True)`), which goes on learning the team plans and the
    comparer's demonstrations with one optimizer: the base the team's hosted searcher and comparer
    share (saved as `planner` only)."""
    torch.manual_seed(cfg.seed)
    task = make_task(cfg)
    pm, ptok = load(base.planner_path)
    popt = torch.optim.AdamW(pm.parameters(), lr=cfg.lr)
    if shared:
        cm, ctok, copt = pm, ptok, popt
    else:
        ctok = train_tokenizer(tokenizer_texts(task), cfg.subagent_vocab)
        cm = build_model("tiny", ctok, seed=cfg.seed + 2)
        copt = torch.optim.AdamW(cm.parameters(), lr=cfg.lr)
    questions = _train_questions(task, cfg)
    comparisons = [s for s in subtasks_of(task, questions, team=True) if team_role(s) == "comparer"]
    rng = random.Random(cfg.seed)
    for step in range(max(1, cfg.steps // 3)):
        p_batch = [planner_demo(task, ptok, q, team=True) for q in rng.sample(questions, cfg.batch_size)]
        c_batch = [comparer_demo(ctok, s) for s in rng.sample(comparisons, cfg.batch_size)]
        losses = {
            "planner/sft_loss": _sft(pm, popt, ptok, p_batch, cfg),
            "comparer/sft_loss": _sft(cm, copt, ctok, c_batch, cfg),
        }
        if on_step:
            on_step(step, losses)
    out.mkdir(parents=True, exist_ok=True)
    save(pm, ptok, out / "planner")
    if not shared:
        save(cm, ctok, out / "comparer")
        shutil.copytree(base.subagent_path, out / "searcher")
    (out / "config.json").write_text(cfg.provenance())
    (out / "eval.json").write_text(json.dumps({}, indent=2))
    return WarmstartResult(
        out, out / "planner", out / ("planner" if shared else "searcher"), {}, cached=False
    )


@dataclass(frozen=True)
class DeepResearchWarmStart:
    """The deep-research workflows' `WarmStart` (`mgrpo.workflows.spec`): `pair` (planner and
    sub-agent), `single` (the single-agent baseline's one model), `team` (planner, searcher,
    comparer), `shared` (one model for planner and sub-agent: a job with a hosted sub-agent starts
    its planner's base from it, whichever of these its workflow names) or `shared_team` (one model for
    the team's three roles: the team's with hosted callees). Its config comes from the job's seed, world size, warm-start steps and the presets of
    the workflow's root and first callee (in single_agent mode, of the workflow the job names)."""

    kind: Literal["pair", "single", "team", "shared", "shared_team"]
    title: str = "warm start"

    @property
    def one_model(self) -> bool:
        """One model for every role (the base hosted callees share)."""
        return self.kind in ("shared", "shared_team")

    def config(self, job: JobSpec) -> WarmstartConfig:
        steps = 350 if job.cfg.warmstart_steps is None else job.cfg.warmstart_steps
        wf = job.workflow  # not job.flow: single_agent mode still names the warm start's sub-agent
        callee = job.model_of(wf.callees[0]).preset if wf.callees else None
        return WarmstartConfig(
            seed=job.cfg.seed,
            n_people=job.cfg.n_people,
            steps=steps,
            planner_preset=job.model_of(wf.root).preset or "tiny",
            subagent_preset=callee or "tiny-wide",
            eval_questions=100 if steps >= 100 else 0,
            guess_share=job.cfg.warmstart_guess_share,
            # the pair's planner (and the shared model's) may learn from the same flawed demonstrator;
            # the single agent's always does, the team's planner never
            planner_sees_guesses=job.cfg.warmstart_planner_sees_guesses and self.kind in ("pair", "shared"),
        )

    def steps(self, config: WarmstartConfig) -> int:
        return config.steps

    def eval_rollouts(self, config: WarmstartConfig) -> int:
        return config.eval_rollouts() if self.kind in ("pair", "shared") else 0

    def build(
        self,
        config: WarmstartConfig,
        cache_dir: Path,
        *,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        on_eval: Callable[[], None] | None = None,
    ) -> WarmstartResult:
        return cached_warmstart(
            config,
            cache_dir,
            single_agent=self.kind == "single",
            team=self.kind in ("team", "shared_team"),
            shared=self.one_model,
            on_step=on_step,
            on_eval=on_eval,
        )

    def source(self, job: JobSpec, role: str, cache_dir: Path, *, stop: threading.Event | None = None) -> str:
        if job.hosted_callees and not self.one_model:  # the callees train adapters on the root's base
            return (SHARED_TEAM if self.kind == "team" else SHARED).source(job, role, cache_dir, stop=stop)
        built = self.build(self.config(job), cache_dir, on_step=stop_check(stop))
        if self.one_model:
            if role != job.root:
                raise ValueError(
                    f"roles.{role}: a hosted callee starts from the root's base, not a warm start of its own"
                )
            return str(built.planner_path)
        if self.kind == "single":
            return str(built.planner_path)
        if self.kind == "team":
            if role == "comparer" and job.model_of(role).preset != "tiny":
                raise ValueError(
                    "roles.comparer.model: the team warm start trains the comparer from the 'tiny' preset; give a path for another model"
                )
            return str(built.folder / role)
        names = {job.workflow.root: built.planner_path, job.workflow.callees[0]: built.subagent_path}
        if role not in names:
            raise ValueError(
                f"roles.{role}.model: the deep-research warm start builds {', '.join(names)}; give a path for {role}"
            )
        return str(names[role])

    def evaluated_on(self, config: WarmstartConfig, n: int) -> WarmstartConfig:
        return replace(config, eval_questions=n)

    def summary(self, built: WarmstartResult) -> list[str]:
        out = []
        for name, m in built.metrics.items():
            process = "  ".join(
                f"{k} {v:.2f}" for k, v in m.items() if k not in ("success", "majority_baseline")
            )
            out += [
                f"{name} success {m['success']:.2f}  majority baseline {m['majority_baseline']:.2f}",
                f"  {process}",
            ]
        return out


PAIR = DeepResearchWarmStart("pair")
SINGLE = DeepResearchWarmStart("single")
TEAM = DeepResearchWarmStart("team")
SHARED = DeepResearchWarmStart("shared")  # one model for both roles: the base a hosted sub-agent shares
SHARED_TEAM = DeepResearchWarmStart("shared_team")  # one model for the team's roles, hosted
