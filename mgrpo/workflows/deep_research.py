"""The deep-research workflow's step assembly (M-GRPO, algorithm.md §2–4) as pure functions over `Sample`s.

Root (planner): the K rollouts of query q form group q; reward R_M (`planner_reward`).
Callee (sub-agent; in the team variant each of searcher and comparer, on its own episodes only): each
rollout's episodes are aligned to D slots (`align_episodes`), and the
query's K·D slots form the sub-agent's group q (pooled); reward R_S (`subagent_reward`) with the
planner's `correct` of the slot's rollout. Duplicated slots are real samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mgrpo.agents.agents import Delegation
from mgrpo.algo import align_episodes, planner_reward, subagent_reward
from mgrpo.algo.alignment import AlignMode
from mgrpo.records import Sample, Transcript
from mgrpo.tasks.deep_research import team_role


def planner_samples(
    query_ids: Sequence[str],
    transcripts: Sequence[Transcript],
    correct: Sequence[float],
    k: int,
    version: int = 0,
) -> tuple[list[Sample], list[float]]:
    """Rollout i = query i // k; `correct[i]` its scored final answer (NaN: unscorable, algorithm.md §4).
    Returns the planner's samples (group = query id) and each rollout's `correct` (0 when the
    rollout is malformed), which the sub-agent's reward uses."""
    if len(transcripts) != len(query_ids) * k or len(correct) != len(transcripts):
        raise ValueError(
            f"{len(transcripts)} rollouts, {len(correct)} scores for {len(query_ids)} queries × K={k}"
        )
    samples, outcome = [], []
    for i, tr in enumerate(transcripts):
        c = correct[i] if tr.format_ok else 0.0
        samples.append(
            Sample(
                "planner",
                query_ids[i // k],
                tr,
                planner_reward(tr.format_ok, c),
                policy_version=version if tr.policy_version is None else tr.policy_version,
            )
        )
        outcome.append(c)
    return samples, outcome


def episodes_by_role(delegations: Sequence[Delegation]) -> dict[str, list[str]]:
    """A rollout's recorded episodes per callee role, in call order."""
    out: dict[str, list[str]] = {}
    for d in delegations:
        if d.episode_id:
            out.setdefault(d.role, []).append(d.episode_id)
    return out


def callee_of(workflow: str, subtask: str) -> str:
    """The role a delegated subtask goes to: the sub-agent, or in the team variant the searcher for a
    lookup and the comparer for a comparison."""
    return team_role(subtask) if workflow == "deep_research_team" else "subagent"


@dataclass(frozen=True)
class Episode:
    """What the sub-agent step needs of a recorded episode."""

    transcript: Transcript
    format_ok: bool
    expert: float  # NaN = unscorable
    policy_version: int = 0


def align_query(
    episodes: Sequence[Sequence[str]], slots: int, *, seed: int, mode: AlignMode
) -> list[tuple[int, str]]:
    """The query's K·D slots as (rollout k, episode id), rollout-major (algorithm.md §3)."""
    aligned = align_episodes([len(e) for e in episodes], slots, seed=seed, mode=mode)
    return [(k, episodes[k][i]) for per_rollout in aligned for k, i in per_rollout]


def subagent_samples(
    query_id: str,
    slots: Sequence[tuple[int, str]],
    fetched: dict[str, Episode],
    correct_main: Sequence[float],
    role: str = "subagent",
) -> list[Sample]:
    """One sample per slot, all in group `query_id`; R_S from the episode and its rollout's outcome."""
    out = []
    for k, eid in slots:
        ep = fetched[eid]
        reward = subagent_reward(ep.format_ok, correct_main[k], ep.expert)
        out.append(
            Sample(role, query_id, ep.transcript, reward, policy_version=ep.policy_version, episode_id=eid)
        )
    return out


def finite_mean(values: Sequence[float]) -> float:
    xs = [v for v in values if not math.isnan(v)]
    return sum(xs) / len(xs) if xs else 0.0
