"""A callee role of the `openai_agents` workflow: a chat model behind OpenAI-compatible
`…/chat/completions` that the user's agent program calls; every call in a session is recorded as an
episode, and the role trains on each step's calls with the rollouts' outcomes (mgrpo/workflows/openai_agents.py)."""

from __future__ import annotations

import time
from typing import Any

from mgrpo.agents.openai_chat import ChatCall, ChatSessions, serve
from mgrpo.algo import alignment_seed
from mgrpo.timing import PhaseTimer
from mgrpo.workflows.deep_research import align_query
from mgrpo.workflows.openai_agents import outcome_samples, program_query
from shared_store import EpisodeArrays
from shared_store.schemas import PlannerStepStats
from subagent_trainer.job import CalleeJob


class ProgramCalleeJob(CalleeJob):
    intake = PlannerStepStats

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.sessions = ChatSessions()

    def intake_stream(self) -> str:
        return "planner_stats"

    def chat_completion(self, session: str | None, body: dict[str, Any]) -> dict[str, Any]:
        self.last_request_s = time.monotonic()
        assert self.cfg.program is not None
        return serve(
            self.m.engine,
            self.m.tokenizer,
            self.role,
            self.sessions,
            session,
            body,
            max_tokens=self.cfg.program.max_tokens,
            parser=self.m.spec.tool_parser,
            record=self.record,
        )

    def record(self, step: int, query_id: str, rollout: int, n: int, call: ChatCall) -> None:
        self.store.episodes.record_call(
            job_id=self.job_id,
            step=step,
            query_id=program_query(query_id, self.role),
            rollout=rollout,
            call=n,
            version=call.weights_version,
            arrays=EpisodeArrays.of(call.token_ids, call.logp, call.mask),
            finish_reason=call.finish_reason,
            subtask=call.last_user,
            result=call.content,
        )

    def handed(self, msg: PlannerStepStats) -> set[str]:
        return {e for q in msg.queries for r in q.rollouts for e in r.episodes.get(self.role, [])}

    def assemble(self, msg: PlannerStepStats, timer: PhaseTimer) -> tuple[list[Any], dict[str, float]]:
        samples, called = [], 0
        for q in msg.queries:
            seed = alignment_seed(self.cfg.seed, msg.step, f"{q.query_id}@run{self.cfg.run_seed}")
            slots = align_query(
                [r.episodes.get(self.role, []) for r in q.rollouts],
                self.cfg.subagent_slots_per_rollout,
                seed=seed,
                mode=self.cfg.alignment,
            )
            if not slots:
                continue
            called += 1
            with timer("exchange_redis"):
                fetched = self.fetch(msg.step, [eid for _, eid in slots])
            samples += outcome_samples(self.role, q.query_id, slots, fetched, [r.correct for r in q.rollouts])
        return samples, {"queries_called": float(called), **self.sessions.take_counts()}
