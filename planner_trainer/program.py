"""The root trainer of the `openai_agents` workflow: the user's agent program is the rollout.

Per step s (the deep-research planner's loop otherwise: questions, reward, statistics to Redis,
update, checkpoint, ledger): `rollout` runs the program K times per query, concurrently, each run a
session with one OpenAI-compatible base URL per role (`<role url>/v1/s/<step>.<query>.<k>`); every
role's service records the calls it serves. `reward` scores each run's final answer with the job's
reward (a failed run: 0, counted). `exchange_redis` finds each role's recorded calls and hands the
callee roles theirs through `planner_stats`; the root role trains on its own calls, aligned to D per
run and pooled per query, with the run's outcome as reward (mgrpo/workflows/openai_agents.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import httpx
import numpy as np

from mgrpo import tracing
from mgrpo.agents.openai_chat import ChatCall, ChatLimits, ChatSessions, serve, session_id
from mgrpo.algo import alignment_seed
from mgrpo.config import ProgramConfig
from mgrpo.programs import check_program
from mgrpo.records import Sample, Transcript
from mgrpo.tasks.deep_research import Question
from mgrpo.timing import PhaseTimer
from mgrpo.workflows import import_string
from mgrpo.workflows.deep_research import (
    CalleeQuery,
    Episode,
    QueryRollouts,
    Rollout,
    aligned_samples,
    finite_mean,
    outcome_reward,
)
from mgrpo.workflows.openai_agents import Call, calls_per_rollout, program_query
from planner_trainer.delegate import CalleeClient
from planner_trainer.job import QuestionRoot
from planner_trainer.queries import log
from planner_trainer.root import Rollouts
from shared_store.keys import parse_episode_id
from shared_store.schemas import PlannerStepStats, QueryStats, RolloutStat

Program = Callable[[str, dict[str, str], str], str]  # (query, base URL per role, api key) -> answer


def load_program(cfg: ProgramConfig, allowed: Collection[str] = ()) -> Program:
    """The job's program: a Python function the operator allowed (`mgrpo.programs`), or an HTTP
    endpoint called the same way."""
    if cfg.entry_point is not None:
        check_program(cfg.entry_point, allowed)
        fn = import_string(cfg.entry_point)
        if not callable(fn):
            raise ValueError(f"program.entry_point: {cfg.entry_point} is not a function")
        return fn
    url = str(cfg.url)

    def over_http(query: str, base_urls: dict[str, str], api_key: str) -> str:
        r = httpx.post(
            url, json={"query": query, "base_urls": base_urls, "api_key": api_key}, timeout=cfg.timeout_s
        )
        r.raise_for_status()
        return str(r.json()["answer"])

    return over_http


class ProgramRootJob(QuestionRoot):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        if self.cfg.program is None:
            raise ValueError(f"program: the {self.job.flow.name} workflow needs the job's agent program")
        http = {r: c for r, c in self.callees.items() if isinstance(c, CalleeClient)}  # every one here
        urls = {self.root: self.placement.public_url, **{r: c.base_url for r, c in http.items()}}
        missing = [r for r in self.job.flow.role_names if not urls.get(r)]
        if missing:
            raise ValueError(
                f"no URL for role(s) {', '.join(missing)}: set MGRPO_PUBLIC_URL on the root service and MGRPO_ROLE_URLS"
            )
        self.program_cfg, self.role_urls = self.cfg.program, urls
        self.program = load_program(self.cfg.program, self.placement.allowed_programs)
        self.sessions = ChatSessions()
        self.program_errors = 0  # the program raised, or returned something other than a string
        # it returned an empty answer (a model may say nothing): scored as a failed run
        self.empty_answers = 0

    # ---- serving the root role's own calls --------------------------------------------------------
    def chat_completion(
        self, session: str | None, body: dict[str, Any], limits: ChatLimits | None = None
    ) -> dict[str, Any]:
        spec = self.model.model_spec
        return serve(
            self.model.engine,
            self.model.tokenizer,
            self.root,
            self.sessions,
            session,
            body,
            max_tokens=self.program_cfg.max_tokens,
            parser=spec.tool_parser,
            record=self.record,
            limits=limits,
        )

    def record(self, step: int, query_id: str, rollout: int, n: int, call: ChatCall) -> None:
        """A call this role served in a program run: an episode of the query `<query>.<role>`."""
        self.store.episodes.record_call(
            self.job_id, step, program_query(query_id, self.root), rollout, n, call
        )

    # ---- a rollout: one run of the program ---------------------------------------------------------
    def rollout(self, step: int, query_id: str, k: int, q: Question, temperature: float) -> Rollout:
        """The run's answer as a transcript without tokens (the trained tokens are the recorded calls)."""
        session = session_id(step, query_id, k)
        urls = {r: f"{u.rstrip('/')}/v1/s/{session}" for r, u in self.role_urls.items()}
        if traceparent := tracing.inject({}).get("traceparent"):  # in the run's rollout span
            self.store.session_traces.put(self.job_id, session, traceparent)  # its calls join its trace
        tr = Transcript.start([])
        try:
            # the API key the program calls with is this run's capability: it records this session only
            answer = self.program(q.text, urls, self.store.capabilities.sign(self.job_id, step, query_id, k))
        except Exception as exc:  # the user's code: any failure is a failed run, counted and logged
            log.warning(
                "job %s: the program failed on %s: %s: %s", self.job_id, session, type(exc).__name__, exc
            )
            answer = None
        if not isinstance(answer, str):
            self.program_errors += 1
            tr.fail("program_error")
        elif not answer.strip():
            self.empty_answers += 1
            tr.fail("empty_answer")
        else:
            tr.finish, tr.final = "answer", answer
        return Rollout(tr)

    def produce(self, step: int) -> Rollouts:
        timer, r = PhaseTimer(job_id=self.job_id, step=step, role=self.root), self.root
        self.wait_bound(step, timer)
        questions, errors_before, empty_before = (
            self.questions(step),
            self.program_errors,
            self.empty_answers,
        )
        with timer("rollout"):
            queries = self.roll_out(step, questions)
        with timer("reward"):
            scores = self.queries.score(queries)
        with timer("exchange_redis"):
            calls = self._calls(step, queries)
            stats = [_stats(q, {c: calls[c][q.query_id] for c in self.remote}) for q in queries]
            samples = self._own_samples(step, queries, calls[r])
            correct = [x.correct for q in queries for x in q.rollouts]
            values = {
                f"{r}/success": finite_mean(correct),
                f"{r}/reward_mean": finite_mean(correct),
                f"{r}/program_errors": float(self.program_errors - errors_before),
                f"{r}/empty_answers": float(self.empty_answers - empty_before),
                f"{r}/reward_rejected": float(scores.rejected),
                f"{r}/reward_errors": float(scores.errors),
                **{f"{c}/calls": float(_count(per_query)) for c, per_query in calls.items()},
                **{f"{r}/{k}": v for k, v in self.sessions.take_counts().items()},
            }
            message = PlannerStepStats(
                job_id=self.job_id, step=step, policy_version=self.version, queries=stats
            )
            produced = {c: _count(calls[c]) for c in self.remote}
            self.publish_produced(step, [("planner_stats", message)], samples, values, produced)
        return Rollouts(step, samples, timer, values)

    def _calls(self, step: int, queries: list[QueryRollouts]) -> dict[str, dict[str, list[list[str]]]]:
        """Each role's recorded calls of the step: per query, per rollout, in call order."""
        found = []
        for eid in self.store.episodes.step_ids(self.job_id, step):
            key = parse_episode_id(eid)
            call = None if key is None else Call.of(eid, key.query_id, key.rollout, key.call)
            if call is not None:
                found.append(call)
        K = self.cfg.rollouts_per_query
        return {
            role: {q.query_id: calls_per_rollout(found, role, q.query_id, K) for q in queries}
            for role in self.job.flow.role_names
        }

    def _own_samples(
        self, step: int, queries: list[QueryRollouts], calls: dict[str, list[list[str]]]
    ) -> list[Sample]:
        """The root role's calls of each query, aligned to D per run and pooled, rewarded with the outcome."""
        samples, _ = aligned_samples(
            self.root,
            [CalleeQuery(q.query_id, calls[q.query_id], [x.correct for x in q.rollouts]) for q in queries],
            slots=self.cfg.subagent_slots_per_rollout,
            mode=self.cfg.alignment,
            seed_of=lambda qid: alignment_seed(self.cfg.seed, step, f"{qid}@run{self.cfg.run_seed}"),
            fetch=lambda ids: {
                eid: Episode.of(*got)
                for eid, got in zip(ids, self.store.episodes.get_many(self.job_id, step, ids), strict=True)
            },
            reward=outcome_reward,
        )
        return samples


def _count(per_query: dict[str, list[list[str]]]) -> int:
    return sum(len(e) for per_rollout in per_query.values() for e in per_rollout)


def _stats(q: QueryRollouts, episodes: dict[str, list[list[str]]]) -> QueryStats:
    """A query's outcomes for the callees: each run's outcome, and each callee's calls in it."""
    correct = [x.correct for x in q.rollouts]
    return QueryStats(
        query_id=q.query_id,
        rollouts=[
            RolloutStat(
                rollout=k,
                reward=x.correct,
                correct=x.correct,
                format_ok=x.transcript.format_ok,
                episodes={role: per_rollout[k] for role, per_rollout in episodes.items()},
            )
            for k, x in enumerate(q.rollouts)
        ],
        reward_mean=finite_mean(correct),
        reward_std=float(np.nanstd(correct)),
    )
