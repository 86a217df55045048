"""The deep-research root (the planner; the single agent in single_agent mode): the `produce` half of
its step (`RootJob` owns the set-up, the loop and the `train` half).

Per step s (phases timed by `PhaseTimer` as `timing/<name>`), produced (pipelined when
max_staleness ≥ 1): `wait_trainer`/`wait_partner` (every trainer applied step s − 1 − max_staleness)
→ `rollout` (K rollouts of each query, all concurrent, every delegation an HTTP call to the callee
role the workflow routes it to) → `reward` (R_M, algorithm.md §2) → per-query statistics to Redis
(the callees' training queue); then trained (`RootJob.train`). `exchange_redis` is the Redis time on
this path; `exchange_http_critical` the longest per-rollout sum of delegation time spent in HTTP and
Redis rather than in the callee's model (from its `Server-Timing` header). A restarted trainer
resumes after the last step its ledger holds, from that step's checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from mgrpo import tracing
from mgrpo.agents.agents import AgentLimits, Delegation, PlannerAgent, SingleAgent
from mgrpo.agents.chat import ChatAgent, ChatFormat, first_string, is_chat_model, tool_schemas
from mgrpo.records import Transcript
from mgrpo.tasks.deep_research import Question
from mgrpo.timing import PhaseTimer
from mgrpo.tools import ToolBox
from mgrpo.workflows.deep_research import QueryRollouts, Rollout, finite_mean, planner_samples
from mgrpo.workflows.deep_research_warmstart import job_task
from planner_trainer.queries import EVAL_STEP, Queries
from planner_trainer.root import Rollouts, RootJob
from shared_store.schemas import PlannerStepStats, QueryStats, RolloutStat


class QuestionRoot(RootJob):
    """A root that answers queries (`Queries`: questions, scoring, held-out evaluation): the
    deep-research planner and the agent-program root. Subclasses write `rollout`."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.task = job_task(self.cfg)
        self.queries = Queries(
            self.store,
            self.job_id,
            self.cfg,
            self.task,
            root=self.root,
            device=self.placement.device,
            emit=self.emit,
            event=self.event,
        )

    def questions(self, step: int) -> list[Question]:
        """The step's questions (a dataset's train split, else the built-in world's)."""
        return self.queries.for_step(step)

    def rollout(self, step: int, query_id: str, k: int, q: Question, temperature: float) -> Rollout:
        """One rollout of a question with the current policy."""
        raise NotImplementedError

    def traced_rollout(self, step: int, query_id: str, k: int, q: Question, temperature: float) -> Rollout:
        """`rollout` in a `rollout` span: the trace its delegations and their episodes join."""
        with tracing.span(
            "rollout",
            job_id=self.job_id,
            step=step,
            role=self.root,
            query_id=query_id,
            rollout=k,
            policy_version=self.version,
        ):
            return self.rollout(step, query_id, k, q, temperature)

    def roll_out(self, step: int, questions: list[Question]) -> list[QueryRollouts]:
        """K rollouts of each question, all concurrent, grouped by query (query i is `q<i>`)."""
        K, T = self.cfg.rollouts_per_query, self.model.model_spec.temperature
        ids = [f"q{i}" for i in range(len(questions))]
        futures = [
            [self.rollout_pool.submit(self.traced_rollout, step, qid, k, q, T) for k in range(K)]
            for qid, q in zip(ids, questions, strict=True)
        ]
        return [
            QueryRollouts(qid, q, [f.result() for f in fs])
            for qid, q, fs in zip(ids, questions, futures, strict=True)
        ]

    def run(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        """The job's steps between held-out evaluations (a dataset with an eval split)."""

        def greedy(query_id: str, q: Question) -> Transcript:
            return self.rollout(EVAL_STEP, query_id, 0, q, 0.0).transcript

        self.queries.evaluated(
            lambda: super(QuestionRoot, self).run(on_step), greedy, fresh=self.start_step == 0
        )

    def close(self) -> None:
        self.queries.close()
        super().close()


class PlannerJob(QuestionRoot):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.single = not self.job.flow.callees  # one agent with every tool
        self.tools = ToolBox(self.job.tools_of(self.root) if self.single else [], self.task.tools)
        spec = self.model.model_spec
        turns, context = (10, 2 * spec.max_context_tokens) if self.single else (6, spec.max_context_tokens)
        self.limits = AgentLimits(turns, context, spec.max_new_tokens_per_turn)
        self.chat = (
            None
            if not is_chat_model(self.model.tokenizer) or self.single
            else ChatFormat(
                self.model.tokenizer,
                tool_schemas([("delegate", "builtin")]),
                parser=spec.tool_parser,
                keep_thinking=spec.keep_thinking,
                terminal="answer",
            )
        )

    def produce(self, step: int) -> Rollouts:
        timer, r = PhaseTimer(job_id=self.job_id, step=step, role=self.root), self.root
        self.wait_bound(step, timer)
        questions = self.questions(step)
        with timer("rollout"):
            queries = self.roll_out(step, questions)
        with timer("reward"):
            scores = self.queries.score(queries)
            samples = planner_samples(queries, r, self.model.engine.weights_version)
        rollouts = [x for q in queries for x in q.rollouts]
        exchange = [sum(d.exchange_s for d in x.delegations) for x in rollouts]  # sequential within a rollout
        every = [d for x in rollouts for d in x.delegations]
        values = {
            f"{r}/reward_mean": finite_mean([s.reward for s in samples]),
            f"{r}/success": finite_mean([x.correct for x in rollouts]),
            f"{r}/reward_rejected": float(scores.rejected),
            f"{r}/reward_errors": float(scores.errors),
            f"{r}/format_ok": float(np.mean([x.transcript.format_ok for x in rollouts])),
            f"{r}/delegations_mean": float(np.mean([len(x.delegations) for x in rollouts])),
            **({f"{r}/{k}": v for k, v in self.tools.take_counts().items()} if self.single else {}),
            "timing/exchange_http_critical": max(exchange, default=0.0),
            "exchange/delegation_ms_mean": 1e3 * float(np.mean([d.exchange_s for d in every] or [0.0])),
            "exchange/delegation_server_queue_ms_mean": 1e3
            * float(np.mean([d.server_queue_s for d in every] or [0.0])),
        }
        with timer("exchange_redis"):
            stats = query_stats(queries)
            message = PlannerStepStats(
                job_id=self.job_id, step=step, policy_version=self.version, queries=stats
            )
            handed = self.remote if self.job.trains_callees else ()
            produced = {c: sum(len(set(x.episodes_by_role().get(c, []))) for x in rollouts) for c in handed}
            self.publish_produced(step, [("planner_stats", message)], samples, values, produced)
        return Rollouts(step, samples, timer, values)

    def rollout(self, step: int, query_id: str, k: int, q: Question, temperature: float) -> Rollout:
        """One rollout of a question: the planner's, each delegation an episode of `step` recorded by
        the callee's service; or the single agent's."""
        if self.single:
            agent = SingleAgent(
                self.model.engine,
                self.model.tokenizer,
                self.tools,
                temperature=temperature,
                limits=self.limits,
            )
            return Rollout(agent.rollout(q.text))
        calls = iter(range(10_000))

        def delegate(subtask: str) -> Delegation:
            body = {
                "job_id": self.job_id,
                "step": step,
                "query_id": query_id,
                "rollout": k,
                "call": next(calls),
            }
            return self.callees[self.job.flow.callee_for(subtask)].episode({**body, "subtask": subtask})

        if self.chat is None:
            planner = PlannerAgent(
                self.model.engine, self.model.tokenizer, delegate, temperature=temperature, limits=self.limits
            )
            done = planner.rollout(q.text)
            return Rollout(done.transcript, done.delegations)
        delegations: list[Delegation] = []

        def call(name: str, arguments: dict[str, Any]) -> str:  # a chat planner delegates through a tool
            if name != "delegate":
                return f"unknown tool {name!r}; tools: delegate"
            delegations.append(delegate(first_string(arguments)))
            return delegations[-1].result

        chat = ChatAgent(
            self.model.engine,
            self.chat,
            call,
            temperature=temperature,
            max_turns=self.limits.max_turns,
            max_context_tokens=self.limits.max_context_tokens,
            max_new_tokens_per_turn=self.limits.max_new_tokens_per_turn,
        )
        return Rollout(chat.run(q.text), delegations)

    def close(self) -> None:
        self.tools.close()
        super().close()


def query_stats(queries: list[QueryRollouts]) -> list[QueryStats]:
    """The per-query outcomes the callees' trainers read (their rewards and alignment come from them)."""
    out = []
    for q in queries:
        stats = [
            RolloutStat(
                rollout=k,
                reward=x.reward,
                correct=x.correct,
                format_ok=x.transcript.format_ok,
                episodes=x.episodes_by_role(),
            )
            for k, x in enumerate(q.rollouts)
        ]
        rr = np.array([s.reward for s in stats])
        out.append(
            QueryStats(
                query_id=q.query_id, rollouts=stats, reward_mean=float(rr.mean()), reward_std=float(rr.std())
            )
        )
    return out
