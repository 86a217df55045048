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

import math
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np

from mgrpo.agents.agents import Delegation
from mgrpo.agents.openai_chat import ChatCall, ChatSessions, serve, session_id
from mgrpo.algo import alignment_seed
from mgrpo.config import ProgramConfig
from mgrpo.records import Sample, Transcript
from mgrpo.tasks.deep_research import Question
from mgrpo.timing import PhaseTimer
from mgrpo.workflows import import_string
from mgrpo.workflows.deep_research import Episode, align_query, finite_mean
from mgrpo.workflows.openai_agents import episodes_of, outcome_samples, program_query
from planner_trainer.job import PlannerJob, log
from planner_trainer.root import Rollouts
from shared_store import EpisodeArrays
from shared_store.schemas import PlannerStepStats, QueryStats, RolloutStat

Program = Callable[[str, dict[str, str], str], str]  # (query, base URL per role, api key) -> answer


def load_program(cfg: ProgramConfig) -> Program:
    """The job's program: a Python function, or an HTTP endpoint called the same way."""
    if cfg.entry_point is not None:
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


class ProgramRootJob(PlannerJob):
    def __init__(self, *args: Any, role_urls: dict[str, str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        assert self.cfg.program is not None
        missing = [r for r in self.cfg.flow.role_names if not role_urls.get(r)]
        if missing:
            raise ValueError(
                f"no URL for role(s) {', '.join(missing)}: set MGRPO_PUBLIC_URL on the root service and MGRPO_ROLE_URLS"
            )
        self.role_urls = role_urls
        self.program = load_program(self.cfg.program)
        self.sessions = ChatSessions()
        self.program_errors = 0  # the program raised, or returned something other than a string
        # it returned an empty answer (a model may say nothing): scored as a failed run
        self.empty_answers = 0

    # ---- serving the root role's own calls --------------------------------------------------------
    def chat_completion(self, session: str | None, body: dict[str, Any]) -> dict[str, Any]:
        assert self.cfg.program is not None
        return serve(
            self.engine,
            self.tokenizer,
            "planner",
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
            query_id=program_query(query_id, "planner"),
            rollout=rollout,
            call=n,
            version=call.weights_version,
            arrays=EpisodeArrays.of(call.token_ids, call.logp, call.mask),
            finish_reason=call.finish_reason,
            subtask=call.last_user,
            result=call.content,
        )

    # ---- a rollout: one run of the program ---------------------------------------------------------
    def rollout(
        self, step: int, query_id: str, k: int, q: Question, temperature: float
    ) -> tuple[Transcript, list[Delegation]]:
        """The run's answer as a transcript without tokens (the trained tokens are the recorded calls)."""
        session = session_id(step, query_id, k)
        urls = {r: f"{u.rstrip('/')}/v1/s/{session}" for r, u in self.role_urls.items()}
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
        return tr, []

    def produce(self, step: int) -> Rollouts:
        timer, K = PhaseTimer(), self.cfg.rollouts_per_query
        self.wait_bound(step, timer)
        questions, errors_before, empty_before = (
            self._questions(step),
            self.program_errors,
            self.empty_answers,
        )
        with timer("rollout"):
            transcripts, _ = self._rollouts(step, questions)
        with timer("reward"):
            scores = self._score(questions, transcripts, K)
            correct = [v if tr.format_ok else 0.0 for v, tr in zip(scores.values, transcripts, strict=True)]
        with timer("exchange_redis"):
            ids = self.store.episodes.step_ids(self.job_id, step)
            qids = [f"q{qi}" for qi in range(len(questions))]
            calls = {r: [episodes_of(ids, r, qid, K) for qid in qids] for r in self.cfg.flow.role_names}
            stats = [
                QueryStats(
                    query_id=qid,
                    rollouts=[
                        RolloutStat(
                            rollout=k,
                            reward=correct[qi * K + k],
                            correct=correct[qi * K + k],
                            format_ok=transcripts[qi * K + k].format_ok,
                            episodes={r: calls[r][qi][k] for r in self.remote},
                        )
                        for k in range(K)
                    ],
                    reward_mean=finite_mean(correct[qi * K : (qi + 1) * K]),
                    reward_std=float(np.nanstd(correct[qi * K : (qi + 1) * K])),
                )
                for qi, qid in enumerate(qids)
            ]
            samples = self._own_samples(step, qids, calls["planner"], correct)
            values = {
                "planner/success": finite_mean(correct),
                "planner/reward_mean": finite_mean(correct),
                "planner/program_errors": float(self.program_errors - errors_before),
                "planner/empty_answers": float(self.empty_answers - empty_before),
                "planner/reward_rejected": float(scores.rejected),
                "planner/reward_errors": float(scores.errors),
                **{f"{r}/calls": float(sum(len(e) for per_q in calls[r] for e in per_q)) for r in calls},
                **{f"planner/{k}": v for k, v in self.sessions.take_counts().items()},
            }
            message = PlannerStepStats(
                job_id=self.job_id, step=step, policy_version=self.version, queries=stats
            )
            produced = {r: sum(len(e) for per_q in calls[r] for e in per_q) for r in self.remote}
            self.publish_produced(step, [("planner_stats", message)], samples, values, produced)
        return Rollouts(step, samples, timer, values)

    def _own_samples(
        self, step: int, qids: list[str], calls: list[list[list[str]]], correct: list[float]
    ) -> list[Sample]:
        """The root role's calls of each query, aligned to D per run and pooled, rewarded with the outcome."""
        K, out = self.cfg.rollouts_per_query, []
        for qi, qid in enumerate(qids):
            seed = alignment_seed(self.cfg.seed, step, f"{qid}@run{self.cfg.run_seed}")
            slots = align_query(
                calls[qi], self.cfg.subagent_slots_per_rollout, seed=seed, mode=self.cfg.alignment
            )
            if not slots:
                continue
            unique = list(dict.fromkeys(e for _, e in slots))
            got = self.store.episodes.get_many(self.job_id, step, unique)
            fetched = {
                eid: Episode(
                    Transcript(a.token_ids.tolist(), a.logp.tolist(), a.loss_mask.tolist(), 0),
                    m.format_ok,
                    math.nan,
                    m.policy_version,
                )
                for eid, (m, a) in zip(unique, got, strict=True)
            }
            out += outcome_samples("planner", qid, slots, fetched, correct[qi * K : (qi + 1) * K])
        return out
