"""The deep-research workflow's step assembly (M-GRPO, algorithm.md §2–4) as pure functions over records.

Root (planner): a step's rollouts come as one `QueryRollouts` per query (its K rollouts in order);
the K rollouts of query q form group q; reward R_M (`planner_reward`).
Callee (sub-agent; in the team variant each of searcher and comparer, on its own episodes only): each
rollout's episodes are aligned to D slots (`align_episodes`), and the query's K·D slots form the
callee's group q (pooled); reward R_S (`subagent_reward`) with the planner's `correct` of the slot's
rollout. Duplicated slots are real samples. `aligned_samples` does the align → fetch → samples of
every callee that trains on aligned episodes (the sub-agents, and each role of `openai_agents`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mgrpo.agents.agents import Delegation
from mgrpo.algo import align_episodes, planner_reward, subagent_reward
from mgrpo.algo.alignment import AlignMode
from mgrpo.records import Sample, Transcript
from mgrpo.tasks.deep_research import Question


@dataclass
class Rollout:
    """One rollout of a query: the root's transcript and the calls it made; `correct` is its scored
    final answer (NaN: unscorable; 0 when the rollout is malformed)."""

    transcript: Transcript
    delegations: list[Delegation] = field(default_factory=list)
    correct: float = 0.0

    @property
    def reward(self) -> float:
        """R_M (algorithm.md §2): format and the scored answer."""
        ok = self.transcript.format_ok
        return planner_reward(ok, self.correct if ok else 0.0)

    def episodes_by_role(self) -> dict[str, list[str]]:
        """The rollout's recorded episodes per callee role, in call order."""
        out: dict[str, list[str]] = {}
        for d in self.delegations:
            if d.episode_id:
                out.setdefault(d.role, []).append(d.episode_id)
        return out


@dataclass
class QueryRollouts:
    """A query's K rollouts, in rollout order (rollout k is `rollouts[k]`)."""

    query_id: str
    question: Question
    rollouts: list[Rollout]


def planner_samples(queries: Sequence[QueryRollouts], role: str, version: int = 0) -> list[Sample]:
    """The root's samples: one per rollout, group = its query's id, reward R_M (`Rollout.reward`);
    `version`: the policy of a transcript that does not name its own."""
    out = []
    for q in queries:
        for r in q.rollouts:
            v = version if r.transcript.policy_version is None else r.transcript.policy_version
            out.append(Sample(role, q.query_id, r.transcript, r.reward, policy_version=v))
    return out


@dataclass(frozen=True)
class Episode:
    """What a callee's step needs of a recorded episode."""

    transcript: Transcript
    format_ok: bool
    expert: float  # NaN = unscorable
    policy_version: int = 0

    @classmethod
    def of(cls, meta: StoredMeta, arrays: StoredArrays) -> Episode:
        """From the store's record of it (`shared_store`: its metadata and its arrays)."""
        tr = Transcript(arrays.token_ids.tolist(), arrays.logp.tolist(), arrays.loss_mask.tolist(), 0)
        expert = math.nan if meta.expert_score is None else meta.expert_score
        return cls(tr, meta.format_ok, expert, meta.policy_version)


class StoredMeta(Protocol):
    @property
    def format_ok(self) -> bool: ...

    @property
    def expert_score(self) -> float | None: ...

    @property
    def policy_version(self) -> int: ...


class StoredArrays(Protocol):
    @property
    def token_ids(self) -> _Array: ...

    @property
    def logp(self) -> _Array: ...

    @property
    def loss_mask(self) -> _Array: ...


class _Array(Protocol):
    def tolist(self) -> Any: ...


@dataclass(frozen=True)
class CalleeQuery:
    """What a callee trains on for one query: its episode ids per rollout (in call order) and each
    rollout's outcome (the planner's `correct`)."""

    query_id: str
    episodes: Sequence[Sequence[str]]
    correct: Sequence[float]


Reward = Callable[[Episode, float], float]  # (episode, its rollout's outcome) → the sample's reward


def subagent_outcome_reward(ep: Episode, correct: float) -> float:
    """R_S (algorithm.md §2): format, the planner's outcome, the expert judge."""
    return subagent_reward(ep.format_ok, correct, ep.expert)


def outcome_reward(ep: Episode, correct: float) -> float:
    """The rollout's outcome alone (`openai_agents`: a call cut off at its budget is not gated)."""
    return correct


def align_query(
    episodes: Sequence[Sequence[str]], slots: int, *, seed: int, mode: AlignMode
) -> list[tuple[int, str]]:
    """The query's K·D slots as (rollout k, episode id), rollout-major (algorithm.md §3)."""
    aligned = align_episodes([len(e) for e in episodes], slots, seed=seed, mode=mode)
    return [(k, episodes[k][i]) for per_rollout in aligned for k, i in per_rollout]


def aligned_samples(
    role: str,
    queries: Sequence[CalleeQuery],
    *,
    slots: int,
    mode: AlignMode,
    seed_of: Callable[[str], int],
    fetch: Callable[[list[str]], Mapping[str, Episode]],
    reward: Reward,
) -> tuple[list[Sample], int]:
    """Align each query's episodes to `slots` (D) per rollout with the draw `seed_of(query_id)`, fetch
    the aligned episodes (`fetch(unique ids)`), and make one sample per slot, all in group query_id,
    rewarded by `reward(episode, its rollout's outcome)`. Returns the samples and how many queries had
    no episode of the role."""
    samples: list[Sample] = []
    empty = 0
    for q in queries:
        chosen = align_query(q.episodes, slots, seed=seed_of(q.query_id), mode=mode)
        if not chosen:
            empty += 1
            continue
        fetched = fetch(list(dict.fromkeys(eid for _, eid in chosen)))
        for k, eid in chosen:
            ep = fetched[eid]
            r = reward(ep, q.correct[k])
            samples.append(
                Sample(role, q.query_id, ep.transcript, r, policy_version=ep.policy_version, episode_id=eid)
            )
    return samples, empty


def finite_mean(values: Sequence[float]) -> float:
    xs = [v for v in values if not math.isnan(v)]
    return sum(xs) / len(xs) if xs else 0.0
