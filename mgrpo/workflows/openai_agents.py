"""The `openai_agents` workflow: the user's agent program is the rollout (its math as pure functions).

Per step, the root trainer runs the program K times per query; each run is a session
(`<step>.<query>.<rollout>`) with one OpenAI-compatible base URL per role. Every chat completion a
role serves in a session is one episode of that role, recorded under the query `<query>.<role>`
(`program_query`). The program's final answer is scored (the job's reward: `correct` ∈ [0, 1]);
every episode of a rollout gets that outcome as its reward (0 when the program failed; a truncated
call is not gated: what the program made of it is in the outcome), and each role's episodes of a
query are aligned to D slots per rollout and pooled into the query's group (algorithm.md §3–4,
`mgrpo.workflows.deep_research.aligned_samples` with `outcome_reward`), as M-GRPO does for
sub-agents. A role the program never called in a step has no samples that step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def program_query(query_id: str, role: str) -> str:
    """The query part of a program episode's id: the query and the role that served the call."""
    return f"{query_id}.{role}"


@dataclass(frozen=True)
class Call:
    """One served chat completion of a program run: its episode id and what the id records."""

    episode_id: str
    query_id: str
    role: str
    rollout: int
    call: int

    @classmethod
    def of(cls, episode_id: str, stored_query: str, rollout: int, call: int) -> Call | None:
        """From an episode's id and its parts (`stored_query` is `program_query(query, role)`); None
        for an episode that is not a program call."""
        query_id, dot, role = stored_query.rpartition(".")
        return cls(episode_id, query_id, role, rollout, call) if dot and query_id and role else None


def calls_per_rollout(calls: Sequence[Call], role: str, query_id: str, k: int) -> list[list[str]]:
    """A role's episode ids of one query, per rollout, in call order."""
    per: list[list[Call]] = [[] for _ in range(k)]
    for c in calls:
        if (c.query_id, c.role) == (query_id, role) and c.rollout < k:
            per[c.rollout].append(c)
    return [[c.episode_id for c in sorted(r, key=lambda c: c.call)] for r in per]
