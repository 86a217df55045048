"""A callee role of the `openai_agents` workflow: a chat model behind OpenAI-compatible
`…/chat/completions` that the user's agent program calls; every call in a session is recorded as an
episode, and the role trains on each step's calls, aligned and pooled per query, with the rollouts'
outcomes (mgrpo/workflows/openai_agents.py)."""

from __future__ import annotations

import time
from typing import Any

from mgrpo.agents.openai_chat import ChatCall, ChatLimits, ChatSessions, serve
from mgrpo.records import Sample
from mgrpo.timing import PhaseTimer
from mgrpo.workflows.deep_research import Episode, outcome_reward
from mgrpo.workflows.openai_agents import program_query
from shared_store.schemas import PlannerStepStats
from subagent_trainer.job import AlignedCalleeJob


class ProgramCalleeJob(AlignedCalleeJob):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        if self.cfg.program is None:
            raise ValueError(f"program: the {self.job.flow.name} workflow needs the job's agent program")
        self.max_tokens = self.cfg.program.max_tokens
        self.sessions = ChatSessions()

    def reward(self, episode: Episode, outcome: float) -> float:
        return outcome_reward(episode, outcome)

    def chat_completion(
        self, session: str | None, body: dict[str, Any], limits: ChatLimits | None = None
    ) -> dict[str, Any]:
        self.last_request_s = time.monotonic()
        spec = self.model.model_spec
        return serve(
            self.model.engine,
            self.model.tokenizer,
            self.role,
            self.sessions,
            session,
            body,
            max_tokens=self.max_tokens,
            parser=spec.tool_parser,
            record=self.record,
            limits=limits,
        )

    def record(self, step: int, query_id: str, rollout: int, n: int, call: ChatCall) -> None:
        """A call this role served in a program run: an episode of the query `<query>.<role>`."""
        self.store.episodes.record_call(
            self.job_id, step, program_query(query_id, self.role), rollout, n, call
        )

    def assemble(self, msg: PlannerStepStats, timer: PhaseTimer) -> tuple[list[Sample], dict[str, float]]:
        samples, empty = self.aligned(msg, timer)
        called = len(msg.queries) - empty
        return samples, {"queries_called": float(called), **self.sessions.take_counts()}
