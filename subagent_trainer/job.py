"""One job on a callee role's service: the role's model, episode serving, and the training loop
that consumes the role's per-step intake stream.

Every callee role runs the same loop (`CalleeJob.run`): read the step's message from its intake
stream (exactly once per step: `consume_once` and the ledger) → `align` (fetch the step's episodes
and assemble `Sample`s: grouping and rewards come from the workflow) → `adv` (`assign_advantages`,
per (role, group)) → `update` (clipped PPO) → `checkpoint` → policy version and progress. Phases are
timed as `timing/<role>_<phase>`.

- `SubagentJob` (deep_research's sub-agent): intake `planner_stats`; aligns each query's episodes to
  K·D slots and computes R_S itself (algorithm.md §2–4).
- `RoleJob` (any role a root scores itself, e.g. MarsRL's verifier and corrector): intake
  `batch.<role>`, whose groups and rewards the root trainer wrote.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch

from mgrpo.advantages import assign_advantages
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
from mgrpo.config import JobConfig
from mgrpo.records import Sample, Transcript
from mgrpo.role_model import RoleModel
from mgrpo.runtime import job_task
from mgrpo.tasks.arithmetic import parse_turn
from mgrpo.timing import PhaseTimer
from mgrpo.tools import ToolBox
from mgrpo.workflows import get_workflow, import_string
from mgrpo.workflows.deep_research import Episode, align_query, subagent_samples
from shared_store import EpisodeArrays, Store, keys
from shared_store.jobs import JobCancelled
from shared_store.schemas import (
    TERMINAL,
    EpisodeMeta,
    MetricsEvent,
    PlannerStepStats,
    PolicyVersion,
    RoleBatch,
    StepMessage,
    episode_id,
)
from shared_store.streams import StreamConsumer, consume_once, publish_metrics


class CalleeJob:
    intake: ClassVar[type[StepMessage]]

    def __init__(
        self,
        store: Store,
        job_id: str,
        cfg: JobConfig,
        role: str,
        *,
        cache_dir: Path,
        checkpoint_dir: Path,
        device: torch.device | str = "cpu",
        sglang_url: str = "",
        sglang_sync_host: str = "",
        consumer_name: str = "",
    ) -> None:
        self.store, self.job_id, self.cfg, self.role = store, job_id, cfg, role
        self.consumer_name = consumer_name or f"{role}-trainer"
        self.m = RoleModel(
            cfg,
            role,
            cache_dir=cache_dir,
            checkpoint_dir=checkpoint_dir,
            job_id=job_id,
            last_step=store.ledger.last_step(job_id, role),
            device=device,
            sglang_url=sglang_url,
            sglang_sync_host=sglang_sync_host,
        )
        self.trains = cfg.mode == "co_train"
        self.last_request_s = time.monotonic()  # when an episode was last asked for
        store.policies.publish(
            PolicyVersion(job_id=job_id, role=role, version=self.m.version, step=self.m.start_step - 1)
        )

    @property
    def version(self) -> int:
        return self.m.version

    @property
    def engine(self) -> Any:
        return self.m.engine

    @property
    def tokenizer(self) -> Any:
        return self.m.tokenizer

    def intake_stream(self) -> str:
        raise NotImplementedError

    # ---- serving ------------------------------------------------------------------------------------
    def episode(self, text: str) -> tuple[Transcript, float, str]:
        """Run the role on one input: (transcript, expert score or NaN, result shown to the caller)."""
        raise NotImplementedError

    def run_episode(
        self, step: int, query_id: str, rollout: int, call: int, subtask: str
    ) -> tuple[EpisodeMeta, float]:
        """Run one delegated input with the current policy and record it (arrays + meta) in Redis, once
        per episode id: a replayed request (a retry, a restarted root) gets the recorded episode back.
        Returns the episode's metadata and the seconds the Redis work took."""
        t0 = time.perf_counter()
        self.last_request_s = time.monotonic()
        recorded = self.store.episodes.get_one(self.job_id, step, episode_id(step, query_id, rollout, call))
        lookup_s = time.perf_counter() - t0
        if recorded is not None:
            return recorded[0], lookup_s
        tr, expert, result = self.episode(subtask)
        version = self.m.engine.weights_version if tr.policy_version is None else tr.policy_version
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
        unique = list(dict.fromkeys(ids))
        got = self.store.episodes.get_many(self.job_id, step, unique)
        return {
            eid: Episode(
                Transcript(arr.token_ids.tolist(), arr.logp.tolist(), arr.loss_mask.tolist(), 0),
                meta.format_ok,
                math.nan if meta.expert_score is None else meta.expert_score,
                meta.policy_version,
            )
            for eid, (meta, arr) in zip(unique, got, strict=True)
        }

    # ---- training -----------------------------------------------------------------------------------
    def run(self) -> None:
        """Train every step of the job as its intake messages arrive, until the last step is in the
        ledger; returns early when the job ended elsewhere, raises JobCancelled on a cancel."""
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
            if record.status in TERMINAL:
                return  # the root finished it (failed / cancelled)
            if record.cancel_requested:
                raise JobCancelled()
            consume_once(consumer, self.store.ledger, self.role, self.train_step, count=1, block_ms=200)
        if self.cfg.dataset is not None and self.cfg.dataset.eval_split is not None:
            self.serve_until_done()

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
        timer, r = PhaseTimer(f"timing/{self.role}_"), self.role
        with timer("align"):
            samples, extra = self.assemble(msg, timer)
        with timer("adv"):
            adv = assign_advantages(samples)
        if self.trains:  # the role's queue, accounted per step in unique episodes
            handed = self.handed(msg)
            used = {s.episode_id for s in samples}
            dropped = {s.episode_id for s in samples if self.m.drops(s)}
            self.store.accounts.record(
                self.job_id,
                r,
                msg.step,
                trained=len(used - dropped),
                dropped=len(dropped),
                unaligned=len(handed - used),
            )
        with timer("update"):
            metrics = self.m.update(samples, seed=msg.step) if self.trains else {}
        with timer("checkpoint"):
            ckpt = self.m.save(msg.step, push=bool(metrics))
        with timer("exchange_redis"):
            self.store.commit_step(
                PolicyVersion(
                    job_id=self.job_id,
                    role=r,
                    version=self.version,
                    step=msg.step,
                    checkpoint=self.m.shown(ckpt.path),
                ),
                roles=self.cfg.trainer_roles,
                ledger=False,
            )
        rewards = np.array([s.reward for s in samples if not math.isnan(s.reward)] or [0.0])
        values = {
            **{f"{r}/{k}": v for k, v in metrics.items()},
            **{f"{r}/{k}": v for k, v in extra.items()},
            f"{r}/reward_mean": float(rewards.mean()),
            f"{r}/reward_std": float(rewards.std()),
            f"{r}/adv_std": float(adv.std()) if len(adv) > 1 else 0.0,
            f"{r}/samples": float(len(samples)),
            f"{r}/version": float(self.version),
            **timer.values(),
        }
        publish_metrics(
            self.store.client, MetricsEvent(job_id=self.job_id, step=msg.step, role=r, values=values)
        )
        return self.version

    def close(self) -> None:
        self.m.close()


class SubagentJob(CalleeJob):
    """deep_research's sub-agent (and the team variant's searcher and comparer): tool episodes with the
    role's tools; its own episodes of each query aligned and pooled (algorithm.md §2–4)."""

    intake = PlannerStepStats

    def __init__(self, store: Store, job_id: str, cfg: JobConfig, role: str = "subagent", **kw: Any) -> None:
        super().__init__(store, job_id, cfg, role, **kw)
        self.task = job_task(cfg)
        spec = self.m.spec
        self.tools = ToolBox(cfg.tools_of(role), self.task.tools)  # the role's own tools only
        self.drift, self.drift_lock = [0, 0], threading.Lock()  # chat episodes: served, re-tokenising drifts
        self.agent: SubAgent | ChatAgent
        if is_chat_model(self.tokenizer):  # a chat model's folder: its template and tool-call format
            fmt = ChatFormat(
                self.tokenizer,
                tool_schemas([(t.name, t.kind) for t in cfg.tools_of(role)]),
                parser=spec.tool_parser,
                keep_thinking=spec.keep_thinking,
                terminal="result",
            )
            self.agent = ChatAgent(
                self.engine,
                fmt,
                lambda name, args: self.tools(name, first_string(args)),
                temperature=spec.temperature,
                max_turns=4,
                max_context_tokens=spec.max_context_tokens,
                max_new_tokens_per_turn=spec.max_new_tokens_per_turn,
            )
        else:
            self.agent = SubAgent(
                self.engine,
                self.tokenizer,
                self.tools,
                temperature=spec.temperature,
                limits=AgentLimits(4, spec.max_context_tokens, spec.max_new_tokens_per_turn),
            )

    def intake_stream(self) -> str:
        return "planner_stats"

    def episode(self, text: str) -> tuple[Transcript, float, str]:
        tr = self.agent.run(text)
        if isinstance(self.agent, ChatAgent):  # reported: would re-tokenising its turns change the ids?
            drift = retokenize_drift(self.agent.fmt, tr)
            with self.drift_lock:
                self.drift[0] += 1
                self.drift[1] += drift
        expert = self.task.judge(text, tr.final or "") if tr.format_ok else 0.0
        return tr, expert, tr.final if tr.format_ok and tr.final else "no result"

    def handed(self, msg: PlannerStepStats) -> set[str]:
        return {e for q in msg.queries for r in q.rollouts for e in r.episodes.get(self.role, [])}

    def assemble(self, msg: PlannerStepStats, timer: PhaseTimer) -> tuple[list[Sample], dict[str, float]]:
        samples: list[Sample] = []
        empty = 0
        for q in msg.queries:
            seed = alignment_seed(self.cfg.seed, msg.step, f"{q.query_id}@run{self.cfg.run_seed}")
            slots = align_query(
                [r.episodes.get(self.role, []) for r in q.rollouts],
                self.cfg.subagent_slots_per_rollout,
                seed=seed,
                mode=self.cfg.alignment,
            )
            if not slots:
                empty += 1
                continue
            with timer("exchange_redis"):
                fetched = self.fetch(msg.step, [eid for _, eid in slots])
            samples += subagent_samples(
                q.query_id, slots, fetched, [r.correct for r in q.rollouts], self.role
            )
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

    def __init__(self, store: Store, job_id: str, cfg: JobConfig, role: str, **kw: Any) -> None:
        super().__init__(store, job_id, cfg, role, **kw)
        spec = self.m.spec
        self.agent = TurnAgent(
            self.engine,
            self.tokenizer,
            temperature=spec.temperature,
            max_new_tokens=spec.max_new_tokens_per_turn,
        )

    def intake_stream(self) -> str:
        return keys.batch_stream(self.role)

    def episode(self, text: str) -> tuple[Transcript, float, str]:
        ((result, tr),) = self.agent.sample(text, 1)
        if not parse_turn(result).format_ok:
            tr.fail("format_error")
        return tr, math.nan, result

    def handed(self, msg: RoleBatch) -> set[str]:
        return {e.episode_id for g in msg.groups for e in g.episodes}

    def assemble(self, msg: RoleBatch, timer: PhaseTimer) -> tuple[list[Sample], dict[str, float]]:
        ids = [e.episode_id for g in msg.groups for e in g.episodes]
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


def callee_job(cfg: JobConfig) -> Callable[..., CalleeJob]:
    """The job class of a callee role in the job's workflow."""
    custom = get_workflow(cfg.workflow).callee_job
    if custom:
        return cast(Callable[..., CalleeJob], import_string(custom))
    if cfg.engine == "openai_agents":
        from subagent_trainer.program import ProgramCalleeJob  # it builds on this module

        return ProgramCalleeJob
    return RoleJob if cfg.engine == "marsrl" else SubagentJob
