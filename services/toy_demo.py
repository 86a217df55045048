"""Interim `mgrpo demo`: a real M-GRPO co-training loop on a toy delegation task, through Redis.

Until the trainer services exist (issue 5), this is the smallest real piece of the system: two
distinct torch policies (a planner and a sub-agent, each its own parameters and optimizer) trained
jointly with the core math (`mgrpo.algo`), exchanging *only* per-step statistics, episodes (binary
arrays) and aligned-batch manifests through the Redis store, with the step ledger and garbage
collection. Both roles run in one process here; the services issue splits them into processes.

Toy task: a query has a hidden type t ∈ {0..3}. The planner picks how many subtasks to delegate
(d ∈ {0..3}; d = 0 answers unresearched and is malformed). Each delegated sub-agent episode picks a
tool a ∈ {0..3}; it finds the fact iff a == t (expert = 1). The planner is correct iff one of its
episodes found the fact. Untrained, both policies are uniform: planner success ≈ 0.44.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from mgrpo.algo import (
    align_episodes,
    alignment_seed,
    group_advantages,
    planner_reward,
    policy_loss,
    subagent_reward,
)
from shared_store import EpisodeArrays, Store
from shared_store.schemas import (
    AlignedBatchManifest,
    AlignedQuery,
    EpisodeMeta,
    LedgerEntry,
    PlannerStepStats,
    PolicyVersion,
    QueryStats,
    RolloutStat,
    episode_id,
)
from shared_store.streams import get_step, publish_step

N_TYPES, N_PLANS, N_TOOLS = 4, 4, 4


@dataclass
class ToyConfig:
    steps: int = 40
    queries_per_step: int = 8
    rollouts_per_query: int = 8  # K
    subagent_slots_per_rollout: int = 2  # D
    lr: float = 0.5
    seed: int = 0


class Policy(torch.nn.Module):
    """A tabular softmax policy: logits (context, action)."""

    def __init__(self, n_ctx: int, n_act: int) -> None:
        super().__init__()
        self.logits = torch.nn.Parameter(torch.zeros(n_ctx, n_act))

    def logp(self, ctx: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.logits[ctx], -1).gather(-1, act.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def sample(self, ctx: int, gen: torch.Generator) -> tuple[int, float]:
        probs = torch.softmax(self.logits[ctx], -1)
        act = int(torch.multinomial(probs, 1, generator=gen))
        return act, math.log(float(probs[act]))


@dataclass
class Batch:
    """One role's training samples of a step: context, action, logp_old, reward, group id."""

    ctx: list[int] = field(default_factory=list)
    act: list[int] = field(default_factory=list)
    old: list[float] = field(default_factory=list)
    rew: list[float] = field(default_factory=list)
    gid: list[int] = field(default_factory=list)

    def add(self, ctx: int, act: int, old: float, rew: float, gid: int) -> None:
        self.ctx.append(ctx)
        self.act.append(act)
        self.old.append(old)
        self.rew.append(rew)
        self.gid.append(gid)

    def advantages(self) -> torch.Tensor:
        return group_advantages(torch.tensor(self.rew), torch.tensor(self.gid))  # (B,)


def _update(policy: Policy, opt: torch.optim.Optimizer, b: Batch, adv: torch.Tensor) -> dict[str, float]:
    logp = policy.logp(torch.tensor(b.ctx), torch.tensor(b.act)).unsqueeze(-1)  # (B, 1): one token each
    loss, metrics = policy_loss(logp, torch.tensor(b.old).unsqueeze(-1), adv, torch.ones_like(logp))
    opt.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    return metrics


def run_toy(
    store: Store, job_id: str, cfg: ToyConfig, on_step: Callable[[int, dict[str, float]], None]
) -> None:
    gen = torch.Generator().manual_seed(cfg.seed)
    planner, subagent = Policy(N_TYPES, N_PLANS), Policy(N_TYPES, N_TOOLS)
    p_opt = torch.optim.SGD(planner.parameters(), lr=cfg.lr)
    s_opt = torch.optim.SGD(subagent.parameters(), lr=cfg.lr)
    for step in range(cfg.steps):
        # ---- planner role: rollouts (with delegations), rewards, stats → store, update
        pb, queries = Batch(), []
        for qi in range(cfg.queries_per_step):
            qtype, qid = int(torch.randint(N_TYPES, (1,), generator=gen)), f"q{qi}"
            rollouts = []
            for k in range(cfg.rollouts_per_query):
                d, lp = planner.sample(qtype, gen)
                eids, found = [], 0.0
                for call in range(d):  # a delegation = one sub-agent episode with its own policy
                    tool, slp = subagent.sample(qtype, gen)
                    meta = EpisodeMeta(job_id=job_id, step=step, policy_version=step, episode_id=episode_id(step, qid, k, call),
                                       query_id=qid, rollout=k, call=call, n_tokens=1, expert_score=float(tool == qtype))  # fmt: skip
                    store.episodes.put(meta, EpisodeArrays.of([qtype * N_TOOLS + tool], [slp], [1]))
                    eids.append(meta.episode_id)
                    found = max(found, float(tool == qtype))
                reward = planner_reward(d > 0, found)
                rollouts.append(
                    RolloutStat(rollout=k, reward=reward, correct=found, format_ok=d > 0, episode_ids=eids)
                )
                pb.add(qtype, d, lp, reward, qi)
            r = np.array([x.reward for x in rollouts])
            queries.append(
                QueryStats(
                    query_id=qid, rollouts=rollouts, reward_mean=float(r.mean()), reward_std=float(r.std())
                )
            )
        publish_step(
            store.client,
            "planner_stats",
            PlannerStepStats(job_id=job_id, step=step, policy_version=step, queries=queries),
        )
        p_metrics = _update(planner, p_opt, pb, pb.advantages())
        store.ledger.mark(LedgerEntry(job_id=job_id, role="planner", step=step, policy_version=step + 1))
        store.policies.publish(PolicyVersion(job_id=job_id, role="planner", version=step + 1, step=step))
        store.progress.advance(job_id, "planner", step)

        # ---- sub-agent role: read the planner's stats from the store, reward, align, advantages, update
        stats = get_step(store.client, PlannerStepStats, job_id, "planner_stats", step)
        if stats is None:
            raise RuntimeError(f"planner statistics of step {step} are missing from the store")
        s_metrics, manifest = _subagent_step(store, job_id, step, stats, subagent, s_opt, cfg)
        publish_step(store.client, "manifests", manifest)
        store.ledger.mark(LedgerEntry(job_id=job_id, role="subagent", step=step, policy_version=step + 1))
        store.policies.publish(PolicyVersion(job_id=job_id, role="subagent", version=step + 1, step=step))
        store.progress.advance(job_id, "subagent", step)
        store.progress.collect(job_id, keep_steps=1)

        correct = [ro.correct for q in stats.queries for ro in q.rollouts]
        on_step(step, {"planner/reward_mean": float(np.mean(pb.rew)), "planner/success": float(np.mean(correct)),
                       "planner/clip_frac": p_metrics["clip_frac"], **s_metrics})  # fmt: skip


def _subagent_step(
    store: Store,
    job_id: str,
    step: int,
    stats: PlannerStepStats,
    policy: Policy,
    opt: torch.optim.Optimizer,
    cfg: ToyConfig,
) -> tuple[dict[str, float], AlignedBatchManifest]:
    b, aligned = Batch(), []
    for gi, q in enumerate(stats.queries):
        slots = align_episodes([len(ro.episode_ids) for ro in q.rollouts], cfg.subagent_slots_per_rollout,
                               seed=alignment_seed(cfg.seed, step, q.query_id))  # fmt: skip
        ids = [[q.rollouts[k].episode_ids[i] for k, i in rs] for rs in slots]
        flat = [e for rs in ids for e in rs]
        if not flat:
            continue
        episodes = dict(zip(flat, store.episodes.get_many(job_id, step, flat), strict=True))
        for rs in slots:
            for k, i in rs:
                meta, arr = episodes[q.rollouts[k].episode_ids[i]]
                token = int(arr.token_ids[0])
                reward = subagent_reward(meta.format_ok, q.rollouts[k].correct, meta.expert_score or 0.0)
                b.add(token // N_TOOLS, token % N_TOOLS, float(arr.logp[0]), reward, gi)
        aligned.append((q.query_id, ids, len(b.ctx)))
    if not b.ctx:
        return {}, AlignedBatchManifest(job_id=job_id, step=step, policy_version=step, mode="duplicate_drop",
                                        slots_per_rollout=cfg.subagent_slots_per_rollout, queries=[])  # fmt: skip
    adv_t = b.advantages()
    metrics = _update(policy, opt, b, adv_t)
    adv = adv_t.tolist()
    start, queries = 0, []
    for qid, ids, end in aligned:
        a = iter(adv[start:end])
        queries.append(
            AlignedQuery(query_id=qid, slots=ids, advantages=[[next(a) for _ in rs] for rs in ids])
        )
        start = end
    manifest = AlignedBatchManifest(job_id=job_id, step=step, policy_version=step, mode="duplicate_drop",
                                    slots_per_rollout=cfg.subagent_slots_per_rollout, queries=queries)  # fmt: skip
    return {"subagent/reward_mean": float(np.mean(b.rew)), "subagent/samples": float(len(b.rew)),
            "subagent/clip_frac": metrics["clip_frac"]}, manifest  # fmt: skip
