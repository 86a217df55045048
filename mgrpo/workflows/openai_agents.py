"""The `openai_agents` workflow: the user's agent program is the rollout (its math as pure functions).

Per step, the root trainer runs the program K times per query; each run is a session
(`<step>.<query>.<rollout>`) with one OpenAI-compatible base URL per role. Every chat completion a
role serves in a session is one episode of that role (id `s<step>-<query>.<role>-r<k>-c<n>`). The
program's final answer is scored (the job's reward: `correct` ∈ [0, 1]); every episode of a rollout
gets that outcome as its reward (0 when the program failed; a truncated call is not gated: what the
program made of it is in the outcome), and each role's episodes of a query are
aligned to D slots per rollout and pooled into the query's group (algorithm.md §3–4), as M-GRPO does for
sub-agents. A role the program never called in a step has no samples that step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mgrpo.records import Sample
from mgrpo.workflows.deep_research import Episode

_ID = re.compile(r"^s(\d+)-([A-Za-z][A-Za-z0-9_]*)\.([a-z][a-z0-9_]*)-r(\d+)-c(\d+)$")


def program_query(query_id: str, role: str) -> str:
    """The query part of a program episode's id: the query and the role that served the call."""
    return f"{query_id}.{role}"


def parse_episode(eid: str) -> tuple[str, str, int] | None:
    """(query id, role, rollout) of a program episode id; None for any other id."""
    m = _ID.match(eid)
    return None if m is None else (m.group(2), m.group(3), int(m.group(4)))


def episodes_of(ids: Sequence[str], role: str, query_id: str, k: int) -> list[list[str]]:
    """A role's episode ids of one query, per rollout (in call order)."""
    per: list[list[tuple[int, str]]] = [[] for _ in range(k)]
    for eid in ids:
        parsed = parse_episode(eid)
        if parsed is not None and parsed[:2] == (query_id, role) and parsed[2] < k:
            per[parsed[2]].append((int(eid.rsplit("-c", 1)[1]), eid))
    return [[e for _, e in sorted(r)] for r in per]


def outcome_samples(
    role: str,
    query_id: str,
    slots: Sequence[tuple[int, str]],
    fetched: dict[str, Episode],
    correct: Sequence[float],
) -> list[Sample]:
    """One sample per aligned slot, all in group `query_id`, rewarded with its rollout's outcome
    `correct[k]` (NaN: unscorable, algorithm.md §4). A call cut off at its token budget is not gated to 0:
    what the program made of it is in the outcome."""
    return [
        Sample(
            role,
            query_id,
            fetched[eid].transcript,
            correct[k],
            policy_version=fetched[eid].policy_version,
            episode_id=eid,
        )
        for k, eid in slots
    ]
