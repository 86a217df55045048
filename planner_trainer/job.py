"""One job on the planner service: the step loop.

Per step s (phases timed as `timing/<name>`): `wait_partner` (the sub-agent's policy is at version
≥ s − max_staleness) → `rollout` (K rollouts of each query, all concurrent, every delegation an HTTP
call to the sub-agent service) → `reward` (R_M, SPEC §3) → per-query statistics to Redis → `adv`
(over each query's K rollouts, SPEC §5) → `update` (clipped PPO, SPEC §6) → `checkpoint` → ledger,
policy version s+1, progress. `exchange_redis` is the Redis time on this path (statistics, ledger,
version, progress); `exchange_http_critical` the longest per-rollout sum of delegation time spent in
HTTP and Redis rather than in the sub-agent's model (from its `Server-Timing` header). A restarted trainer resumes after the last step its
ledger holds, from that step's checkpoint.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from mgrpo.agents.agents import AgentLimits, Delegation, PlannerAgent, SingleAgent
from mgrpo.agents.loop import Transcript
from mgrpo.algo import group_advantages, planner_reward
from mgrpo.checkpoint import latest_checkpoint, restore_trainer_state, save_checkpoint
from mgrpo.config import JobConfig
from mgrpo.models import load, place
from mgrpo.runtime import RoleName, job_task, reference_model, role_model_source, rollout_engine
from mgrpo.tasks.deep_research import Question, make_questions
from mgrpo.training import UpdateSettings, ppo_update
from planner_trainer.delegate import PartnerError, SubagentClient
from shared_store import Store
from shared_store.jobs import JobCancelled
from shared_store.policy import PolicyTimeoutError
from shared_store.schemas import (
    LedgerEntry,
    MetricsEvent,
    PlannerStepStats,
    PolicyVersion,
    QueryStats,
    RolloutStat,
)
from shared_store.streams import publish_metrics, publish_step


class PlannerJob:
    def __init__(self, store: Store, job_id: str, cfg: JobConfig, *, cache_dir: Path, checkpoint_dir: Path,
                 subagent: SubagentClient | None, device: torch.device | str = "cpu", sglang_url: str = "") -> None:  # fmt: skip
        self.store, self.job_id, self.cfg, self.subagent = store, job_id, cfg, subagent
        self.single = cfg.mode == "single_agent"
        self.ckpt_root = checkpoint_dir / job_id / "planner"
        self.task = job_task(cfg)
        last = store.ledger.last_step(job_id, "planner")
        resume = latest_checkpoint(self.ckpt_root, step=last) if last >= 0 else None
        role: RoleName = "single" if self.single else "planner"
        source = str(resume.path) if resume else role_model_source(cfg, role, cache_dir)
        model, self.tokenizer = load(source)
        self.model = place(model, device).eval()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.planner_optim.lr, weight_decay=0.0)
        if resume:
            restore_trainer_state(resume, self.optimizer)
        self.start_step = last + 1
        self.version = resume.version if resume else 0
        self.engine = rollout_engine(self.model, self.tokenizer, sglang_url, weights=source, max_batch=256)
        o, spec = cfg.planner_optim, cfg.planner
        self.limits = AgentLimits(10 if self.single else 6, spec.max_context_tokens * (2 if self.single else 1),
                                  spec.max_new_tokens_per_turn)  # fmt: skip
        self.update_settings = UpdateSettings.of(o, spec.temperature)
        self.ref_model = reference_model(cfg, role, cache_dir, device)
        store.policies.publish(PolicyVersion(job_id=job_id, role="planner", version=self.version, step=last))

    def run(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        for step in range(self.start_step, self.cfg.steps):
            if self.store.jobs.cancel_requested(self.job_id):
                raise JobCancelled()
            values = self.step(step)
            if on_step:
                on_step(step, values)
        self._wait_partner_done()

    def step(self, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        self._wait_partner(step)
        t_wait = time.perf_counter()
        questions = self._questions(step)
        transcripts, delegations = self._rollouts(step, questions)
        t_roll = time.perf_counter()
        rewards, correct, queries = self._rewards(questions, transcripts, delegations)
        t_rew = time.perf_counter()
        publish_step(self.store.client, "planner_stats", PlannerStepStats(job_id=self.job_id, step=step,
                     policy_version=self.version, queries=queries))  # fmt: skip
        t_pub = time.perf_counter()
        groups = torch.arange(len(questions)).repeat_interleave(self.cfg.rollouts_per_query)
        adv = group_advantages(torch.tensor(rewards), groups)
        t_adv = time.perf_counter()
        with self.engine.paused():
            metrics = ppo_update(self.model, self.optimizer, list(zip(transcripts, adv.tolist(), strict=True)),
                                 self.update_settings, pad_id=int(self.tokenizer.pad_token_id), seed=step,
                                 ref_model=self.ref_model)  # fmt: skip
        self.version += 1
        t_upd = time.perf_counter()
        ckpt = save_checkpoint(self.ckpt_root, self.model, self.tokenizer, self.optimizer, step=step,
                               version=self.version, keep_every_steps=self.cfg.checkpoint_keep_every_steps)  # fmt: skip
        if not self.engine.shares_weights:  # an SGLang server: load the new policy before anyone samples it
            self.engine.update_weights(str(ckpt.path))
        t_ckpt = time.perf_counter()
        self._commit(step, ckpt.path)
        t_end = time.perf_counter()
        n_del = [len(d) for d in delegations]
        exchange = [sum(d.exchange_s for d in dels) for dels in delegations]  # sequential within a rollout
        every = [d for dels in delegations for d in dels]
        values = {
            **{f"planner/{k}": v for k, v in metrics.items()},
            "planner/reward_mean": float(np.mean(rewards)), "planner/success": float(np.mean(correct)),
            "planner/format_ok": float(np.mean([t.format_ok for t in transcripts])),
            "planner/delegations_mean": float(np.mean(n_del)), "planner/adv_std": float(adv.std()),
            "planner/version": float(self.version),
            "timing/wait_partner": t_wait - t0, "timing/rollout": t_roll - t_wait, "timing/reward": t_rew - t_roll,
            "timing/adv": t_adv - t_pub, "timing/update": t_upd - t_adv, "timing/checkpoint": t_ckpt - t_upd,
            "timing/exchange_redis": (t_pub - t_rew) + (t_end - t_ckpt), "timing/step": t_end - t0,
            "timing/exchange_http_critical": max(exchange, default=0.0),
            "exchange/delegation_ms_mean": 1e3 * float(np.mean([d.exchange_s for d in every] or [0.0])),
            "exchange/delegation_server_queue_ms_mean": 1e3 * float(np.mean([d.server_queue_s for d in every] or [0.0])),
        }  # fmt: skip
        publish_metrics(
            self.store.client, MetricsEvent(job_id=self.job_id, step=step, role="planner", values=values)
        )
        publish_metrics(self.store.client, MetricsEvent(job_id=self.job_id, step=step, role="planner", kind="event",
                        message=str(ckpt.path), values={"checkpoint": 1.0, "version": float(self.version)}))  # fmt: skip
        return values

    def _commit(self, step: int, ckpt: Path) -> None:
        """The step is done: ledger, policy version, progress (and garbage collection) in Redis."""
        self.store.ledger.mark(
            LedgerEntry(job_id=self.job_id, role="planner", step=step, policy_version=self.version)
        )
        self.store.policies.publish(PolicyVersion(job_id=self.job_id, role="planner", version=self.version, step=step,
                                                  checkpoint=str(ckpt)))  # fmt: skip
        self.store.progress.advance(self.job_id, "planner", step)
        if self.single:
            self.store.progress.advance(self.job_id, "subagent", step)
        self.store.progress.collect(self.job_id, keep_steps=1)

    def _questions(self, step: int) -> list[Question]:
        seed = random.Random(f"{self.cfg.seed}:{self.cfg.run_seed}:{step}").randrange(2**31)
        return make_questions(self.task.world, "train", self.cfg.stage, self.cfg.prompts_per_step, seed=seed)

    def _rollouts(
        self, step: int, questions: list[Question]
    ) -> tuple[list[Transcript], list[list[Delegation]]]:
        jobs = [(qi, k) for qi in range(len(questions)) for k in range(self.cfg.rollouts_per_query)]

        def one(item: tuple[int, int]) -> tuple[Transcript, list[Delegation]]:
            qi, k = item
            if self.single:
                agent = SingleAgent(self.engine, self.tokenizer, self.task.call_tool,
                                    temperature=self.cfg.planner.temperature, limits=self.limits)  # fmt: skip
                return agent.rollout(questions[qi].text), []
            return self._planner_rollout(step, qi, k, questions[qi])

        with ThreadPoolExecutor(max_workers=min(128, len(jobs))) as pool:
            results = list(pool.map(one, jobs))
        return [r[0] for r in results], [r[1] for r in results]

    def _planner_rollout(
        self, step: int, qi: int, k: int, q: Question
    ) -> tuple[Transcript, list[Delegation]]:
        client = self.subagent
        if client is None:
            raise PartnerError("no sub-agent service configured (MGRPO_SUBAGENT_URL)")
        calls = iter(range(10_000))

        def delegate(subtask: str) -> Delegation:
            body = {
                "job_id": self.job_id,
                "step": step,
                "query_id": f"q{qi}",
                "rollout": k,
                "call": next(calls),
                "subtask": subtask,
            }
            return client.episode(body)

        agent = PlannerAgent(
            self.engine,
            self.tokenizer,
            delegate,
            temperature=self.cfg.planner.temperature,
            limits=self.limits,
        )
        rollout = agent.rollout(q.text)
        return rollout.transcript, rollout.delegations

    def _rewards(self, questions: list[Question], transcripts: list[Transcript], delegations: list[list[Delegation]]
                 ) -> tuple[list[float], list[float], list[QueryStats]]:  # fmt: skip
        K = self.cfg.rollouts_per_query
        rewards, correct, queries = [], [], []
        for qi, q in enumerate(questions):
            stats = []
            for k in range(K):
                tr, dels = transcripts[qi * K + k], delegations[qi * K + k]
                c = self.task.correct(tr.final or "", q.answer) if tr.format_ok else 0.0
                r = planner_reward(tr.format_ok, c)
                rewards.append(r)
                correct.append(c)
                stats.append(RolloutStat(rollout=k, reward=r, correct=c, format_ok=tr.format_ok,
                                         episode_ids=[d.episode_id for d in dels if d.episode_id]))  # fmt: skip
            rr = np.array([s.reward for s in stats])
            queries.append(
                QueryStats(
                    query_id=f"q{qi}",
                    rollouts=stats,
                    reward_mean=float(rr.mean()),
                    reward_std=float(rr.std()),
                )
            )
        return rewards, correct, queries

    def _wait_partner(self, step: int) -> None:
        if self.cfg.mode != "co_train":
            return  # main_only: the sub-agent never updates; single_agent: there is none
        need = step - self.cfg.max_staleness
        try:
            self.store.policies.wait_for(self.job_id, "subagent", need, timeout_s=self.cfg.partner_timeout_s)
        except PolicyTimeoutError as exc:
            raise PartnerError(str(exc)) from exc

    def _wait_partner_done(self) -> None:
        """The job is done when the sub-agent has consumed the last step too."""
        if self.single:
            return
        last = self.cfg.steps - 1
        deadline = time.monotonic() + self.cfg.partner_timeout_s
        while not self.store.ledger.is_applied(self.job_id, "subagent", last):
            if time.monotonic() > deadline:
                raise PartnerError(
                    f"the sub-agent trainer did not finish step {last} within {self.cfg.partner_timeout_s:.0f} s"
                )
            if self.store.jobs.cancel_requested(self.job_id):
                raise JobCancelled()
            time.sleep(0.05)

    def close(self) -> None:
        self.engine.close()
