"""One job on a callee role's service: the role's model, episode serving, and the training loop
that consumes the role's per-step intake stream.

Every callee role runs the same loop (`CalleeJob.run`): read the step's message from its intake
stream (exactly once per step: `consume_once` and the ledger) → `align` (fetch the step's episodes
and assemble `Sample`s: grouping and rewards come from the workflow) → `adv` (`assign_advantages`,
per (role, group)) → `update` (clipped PPO) → `checkpoint` → policy version and progress. Phases are
timed as `timing/<role>_<phase>`.

- `AlignedCalleeJob`: intake `planner_stats`; aligns each query's episodes to K·D slots and rewards
  them from the rollouts' outcomes (algorithm.md §2–4): `SubagentJob` (deep research's sub-agents,
  R_S) and `ProgramCalleeJob` (`openai_agents`' roles, the outcome).
- `RoleJob` (any role a root scores itself, e.g. MarsRL's verifier and corrector): intake
  `batch.<role>`, whose groups and rewards the root trainer wrote.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from opentelemetry.context import Context

from mgrpo import tracing
from mgrpo.advantages import advantage_stats, assign_advantages
from mgrpo.agents.agents import AgentLimits, SubAgent, TurnAgent
from mgrpo.agents.chat import (
    ChatAgent,
    ChatFormat,
    first_string,
    is_chat_model,
    retokenize_drift,
    tool_schemas,
)
from mgrpo.algo import alignment_seed
from mgrpo.records import Sample, Transcript
from mgrpo.role_model import RoleModel
from mgrpo.runtime import Placement
from mgrpo.tasks.arithmetic import parse_turn
from mgrpo.timing import PhaseTimer
from mgrpo.tools import ToolBox
from mgrpo.tracking import open_trackers
from mgrpo.workflows import JobSpec
from mgrpo.workflows.deep_research import CalleeQuery, Episode, aligned_samples, subagent_outcome_reward
from mgrpo.workflows.deep_research_warmstart import job_task
from shared_store import EpisodeArrays, Store, keys
from shared_store.jobs import JobCancelled
from shared_store.keys import episode_id
from shared_store.schemas import (
    TERMINAL,
    EpisodeMeta,
    MetricsEvent,
    PlannerStepStats,
    PolicyVersion,
    RoleBatch,
    StepMessage,
)
from shared_store.streams import StreamConsumer, consume_once, publish_event, publish_metrics


@dataclass(frozen=True)
class Served:
    """One input run by the role: its transcript, the expert's score (NaN: none) and what the caller sees."""

    transcript: Transcript
    expert: float
    result: str


class CalleeJob:
    """A callee role's trainer for one job: it serves the role's episodes and trains on each step's
    intake. Subclasses write `episode`, `handed` and `assemble` (`Workflow.callee_job`)."""

    intake: ClassVar[type[StepMessage]]

    def __init__(
        self,
        store: Store,
        job_id: str,
        job: JobSpec,
        role: str,
        *,
        placement: Placement,
        base_of: RoleModel | None = None,
    ) -> None:
        """`base_of`: the root's model, when this role is hosted in the root's trainer with an adapter
        of its own on the root's base (`JobSpec.hosted_callees`)."""
        self.store, self.job_id, self.job, self.cfg, self.role = store, job_id, job, job.cfg, role
        self.consumer_name = placement.consumer_name or f"{role}-trainer"
        last = store.ledger.last_step(job_id, role)
        self.model = RoleModel(job, role, placement=placement, job_id=job_id, last_step=last, base_of=base_of)
        self.trackers = open_trackers(
            job.cfg, job_id, role, placement=placement, start_step=self.model.start_step, report=self.event
        )
        if self.model.start_note:
            self.event(self.model.start_note)
        self.trains = job.trains_callees
        self.last_checkpoint: str | None = None  # the newest checkpoint this trainer wrote (trackers)
        self.last_request_s = time.monotonic()  # when an episode was last asked for
        store.policies.publish(PolicyVersion(job_id=job_id, role=role, version=self.model.version, step=last))

    @property
    def version(self) -> int:
        return self.model.version

    def intake_stream(self) -> str:
        raise NotImplementedError

    # ---- serving ------------------------------------------------------------------------------------
    def episode(self, text: str) -> Served:
        """Run the role on one input."""
        raise NotImplementedError

    def run_episode(
        self,
        step: int,
        query_id: str,
        rollout: int,
        call: int,
        subtask: str,
        *,
        parent: Context | None = None,
        kind: str = "internal",
    ) -> tuple[EpisodeMeta, float]:
        """Run one delegated input with the current policy and record it (arrays + meta) in Redis, once
        per episode id: a replayed request (a retry, a restarted root) gets the recorded episode back.
        Returns the episode's metadata and the seconds the Redis work took. Traced as an `episode`
        span, a child of `parent` (the root's delegation: one trace per rollout) where given."""
        with tracing.span(
            "episode",
            kind=kind,
            parent=parent,
            job_id=self.job_id,
            step=step,
            role=self.role,
            query_id=query_id,
            rollout=rollout,
            policy_version=self.version,
        ):
            return self._run_episode(step, query_id, rollout, call, subtask)

    def _run_episode(
        self, step: int, query_id: str, rollout: int, call: int, subtask: str
    ) -> tuple[EpisodeMeta, float]:
        t0 = time.perf_counter()
        self.last_request_s = time.monotonic()
        recorded = self.store.episodes.get_one(self.job_id, step, episode_id(step, query_id, rollout, call))
        lookup_s = time.perf_counter() - t0
        if recorded is not None:
            return recorded[0], lookup_s
        served = self.episode(subtask)
        tr, expert, result = served.transcript, served.expert, served.result
        version = self.model.engine.weights_version if tr.policy_version is None else tr.policy_version
        meta = EpisodeMeta(
            job_id=self.job_id,
            step=step,
            policy_version=version,
            episode_id=episode_id(step, query_id, rollout, call),
            query_id=query_id,
            rollout=rollout,
            call=call,
            n_tokens=len(tr),
            format_ok=tr.format_ok,
            expert_score=None if math.isnan(expert) else expert,
            finish_reason=tr.finish,
            subtask=subtask,
            result=result,
        )
        t1 = time.perf_counter()
        meta, _ = self.store.episodes.put_once(meta, EpisodeArrays.of(tr.token_ids, tr.logp, tr.mask))
        return meta, lookup_s + time.perf_counter() - t1

    def fetch(self, step: int, ids: list[str]) -> dict[str, Episode]:
        """The step's recorded episodes of these (unique) ids."""
        got = self.store.episodes.get_many(self.job_id, step, ids)
        return {eid: Episode.of(meta, arrays) for eid, (meta, arrays) in zip(ids, got, strict=True)}

    # ---- training -----------------------------------------------------------------------------------
    def run(self) -> None:
        """Train every step of the job as its intake messages arrive, until the last step is in the
        ledger; returns early when the job ended elsewhere, raises JobCancelled on a cancel. Then, where
        the root evaluates a held-out split, serve its episodes until the job ends."""
        if self.train_steps() and self.cfg.dataset is not None and self.cfg.dataset.eval_split is not None:
            self.serve_until_done()

    def train_steps(self, stop: threading.Event | None = None) -> bool:
        """The training loop of `run`; returns whether the last step is in the ledger (False: the job
        ended elsewhere, or `stop` was set)."""
        consumer = StreamConsumer(
            self.store.client,
            keys.stream(self.job_id, self.intake_stream()),
            self.role,
            self.consumer_name,
            self.intake,
            min_idle_ms=30_000,
        )
        last = self.cfg.steps - 1
        while not self.store.ledger.is_applied(self.job_id, self.role, last):
            record = self.store.jobs.get(self.job_id)
            if record.status in TERMINAL or (stop is not None and stop.is_set()):
                return False  # the root finished it (failed / cancelled), or its host stops it
            if record.cancel_requested:
                raise JobCancelled()
            consume_once(consumer, self.store.ledger, self.role, self.train_step, count=1, block_ms=200)
        return True

    def serve_until_done(self) -> None:
        """After the last step, keep serving episodes while the root evaluates the held-out split with
        the final policies: until the job ends, or no episode was asked for in `partner_timeout_s`."""
        while self.store.jobs.get(self.job_id).status not in TERMINAL:
            if time.monotonic() - self.last_request_s > self.cfg.partner_timeout_s:
                return
            time.sleep(0.2)

    def handed(self, msg: Any) -> set[str]:
        """The episode ids the step's intake message hands this role."""
        raise NotImplementedError

    def assemble(self, msg: Any, timer: PhaseTimer) -> tuple[list[Sample], dict[str, float]]:
        """The step's samples (rewards and groups filled) and extra metrics."""
        raise NotImplementedError

    def train_step(self, msg: StepMessage) -> int:
        """Train on one step's intake message; returns the policy version it produced."""
        r = self.role
        timer = PhaseTimer(f"timing/{r}_", job_id=self.job_id, step=msg.step, role=r)
        with timer("align"):
            samples, extra = self.assemble(msg, timer)
        with timer("adv"):
            adv = assign_advantages(samples)
        if self.trains:  # the role's queue, accounted per step in unique episodes
            handed = self.handed(msg)
            used = {s.episode_id for s in samples}
            dropped = {s.episode_id for s in samples if self.model.drops(s)}
            self.store.accounts.record(
                self.job_id,
                r,
                msg.step,
                trained=len(used - dropped),
                dropped=len(dropped),
                unaligned=len(handed - used),
            )
        with timer("update"):
            metrics = self.model.update(samples, seed=msg.step) if self.trains else {}
        with timer("checkpoint"):
            ckpt = self.model.save(msg.step, push=bool(metrics))
            self.last_checkpoint = str(ckpt.path)
        with timer("exchange_redis"):
            self.store.commit_step(
                PolicyVersion(
                    job_id=self.job_id,
                    role=r,
                    version=self.version,
                    step=msg.step,
                    checkpoint=self.model.shown(ckpt.path),
                ),
                roles=self.job.ledger_roles,
                ledger=False,
            )
        rewards = np.array([s.reward for s in samples if not math.isnan(s.reward)] or [0.0])
        values = {
            **{f"{r}/{k}": v for k, v in metrics.items()},
            **{f"{r}/{k}": v for k, v in extra.items()},
            f"{r}/reward_mean": float(rewards.mean()),
            f"{r}/reward_std": float(rewards.std()),
            **{f"{r}/{k}": v for k, v in advantage_stats(adv).items()},
            f"{r}/samples": float(len(samples)),
            f"{r}/version": float(self.version),
            **timer.values(),
        }
        publish_metrics(
            self.store.client, MetricsEvent(job_id=self.job_id, step=msg.step, role=r, values=values)
        )
        self.trackers.log(msg.step, values)
        return self.version

    def event(self, message: str) -> None:
        """A line in the job's events (a tracker's news)."""
        publish_event(self.store.client, self.job_id, self.role, message)

    def close(self) -> None:
        self.trackers.close(checkpoint=self.last_checkpoint)
        self.model.close()


class AlignedCalleeJob(CalleeJob):
    """A callee that trains on its own episodes of each query, aligned to D per rollout and pooled
    (algorithm.md §2–4), with the root's per-query outcomes (`planner_stats`) as its intake."""

    intake = PlannerStepStats

    def reward(self, episode: Episode, outcome: float) -> float:
        """An aligned episode's reward, given its rollout's outcome."""
        raise NotImplementedError

    def intake_stream(self) -> str:
        return "planner_stats"

    def handed(self, msg: PlannerStepStats) -> set[str]:
        return {e for q in msg.queries for r in q.rollouts for e in r.episodes.get(self.role, [])}

    def aligned(self, msg: PlannerStepStats, timer: PhaseTimer) -> tuple[list[Sample], int]:
        """The step's samples of this role and the number of queries without its episodes."""

        def fetch(ids: list[str]) -> dict[str, Episode]:
            with timer("exchange_redis"):
                return self.fetch(msg.step, ids)

        queries = [
            CalleeQuery(
                q.query_id,
                [r.episodes.get(self.role, []) for r in q.rollouts],
                [r.correct for r in q.rollouts],
            )
            for q in msg.queries
        ]
        return aligned_samples(
            self.role,
            queries,
            slots=self.cfg.subagent_slots_per_rollout,
            mode=self.cfg.alignment,
            seed_of=lambda qid: alignment_seed(self.cfg.seed, msg.step, f"{qid}@run{self.cfg.run_seed}"),
            fetch=fetch,
            reward=self.reward,
        )


class SubagentJob(AlignedCalleeJob):
    """deep_research's sub-agent (and the team variant's searcher and comparer): tool episodes with the
    role's tools, rewarded with R_S (format, the planner's outcome, the expert judge)."""

    def reward(self, episode: Episode, outcome: float) -> float:
        return subagent_outcome_reward(episode, outcome)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.task = job_task(self.cfg)
        spec, tokenizer, engine = self.model.model_spec, self.model.tokenizer, self.model.engine
        tools = self.job.tools_of(self.role)
        self.tools = ToolBox(tools, self.task.tools)  # the role's own tools only
        self.drift, self.drift_lock = [0, 0], threading.Lock()  # chat episodes: served, re-tokenising drifts
        self.agent: SubAgent | ChatAgent
        if is_chat_model(tokenizer):  # a chat model's folder: its template and tool-call format
            fmt = ChatFormat(
                tokenizer,
                tool_schemas([(t.name, t.kind) for t in tools]),
                parser=spec.tool_parser,
                keep_thinking=spec.keep_thinking,
                terminal="result",
            )
            self.agent = ChatAgent(
                engine,
                fmt,
                lambda name, args: self.tools(name, first_string(args)),
                temperature=spec.temperature,
                max_turns=4,
                max_context_tokens=spec.max_context_tokens,
                max_new_tokens_per_turn=spec.max_new_tokens_per_turn,
            )
        else:
            limits = AgentLimits(4, spec.max_context_tokens, spec.max_new_tokens_per_turn)
            self.agent = SubAgent(engine, tokenizer, self.tools, temperature=spec.temperature, limits=limits)

    def episode(self, text: str) -> Served:
        tr = self.agent.run(text)
        if isinstance(self.agent, ChatAgent):  # reported: would re-tokenising its turns change the ids?
            drift = retokenize_drift(self.agent.fmt, tr)
            with self.drift_lock:
                self.drift[0] += 1
                self.drift[1] += drift
        expert = self.task.judge(text, tr.final or "") if tr.format_ok else 0.0
        return Served(tr, expert, tr.final if tr.format_ok and tr.final else "no result")

    def assemble(self, msg: PlannerStepStats, timer: PhaseTimer) -> tuple[list[Sample], dict[str, float]]:
        samples, empty = self.aligned(msg, timer)
        with self.drift_lock:
            (n, drifted), self.drift = self.drift, [0, 0]
        chat = {"retokenize_drift": drifted / n} if n else {}  # episodes served since the last step
        return samples, {"queries_without_episodes": float(empty), **self.tools.take_counts(), **chat}

    def close(self) -> None:
        self.tools.close()
        super().close()


class RoleJob(CalleeJob):
    """A role the root scores (MarsRL's verifier, corrector): one turn per input; the root's groups."""

    intake = RoleBatch

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        spec = self.model.model_spec
        self.agent = TurnAgent(
            self.model.engine,
            self.model.tokenizer,
            temperature=spec.temperature,
            max_new_tokens=spec.max_new_tokens_per_turn,
        )

    def intake_stream(self) -> str:
        return keys.batch_stream(self.role)

    def episode(self, text: str) -> Served:
        ((result, tr),) = self.agent.sample(text, 1)
        if not parse_turn(result).format_ok:
            tr.fail("format_error")
        return Served(tr, math.nan, result)

    def handed(self, msg: RoleBatch) -> set[str]:
        return {e.episode_id for g in msg.groups for e in g.episodes}

    def assemble(self, msg: RoleBatch, timer: PhaseTimer) -> tuple[list[Sample], dict[str, float]]:
        ids = list(dict.fromkeys(e.episode_id for g in msg.groups for e in g.episodes))
        with timer("exchange_redis"):
            fetched = self.fetch(msg.step, ids)
        samples = [
            Sample(
                self.role,
                g.group,
                fetched[e.episode_id].transcript,
                e.reward,
                policy_version=fetched[e.episode_id].policy_version,
                episode_id=e.episode_id,
            )
            for g in msg.groups
            for e in g.episodes
        ]
        return samples, {"groups": float(len(msg.groups))}
