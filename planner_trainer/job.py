"""One job on the planner service: the step loop.

Per step s (phases timed by `PhaseTimer` as `timing/<name>`), produced (`RootJob`: pipelined when
max_staleness ≥ 1): `wait_trainer`/`wait_partner` (every trainer applied step s − 1 − max_staleness)
→ `rollout` (K rollouts of each query, all concurrent, every delegation an HTTP call to the sub-agent
service) → `reward` (R_M, SPEC §3) → per-query statistics to Redis (the sub-agent's training queue);
then trained: `adv` (over each query's K rollouts, SPEC §5) → `update` (clipped PPO, SPEC §6) →
`checkpoint` → ledger, policy version, progress. `exchange_redis` is the Redis time on this path (statistics, ledger,
version, progress); `exchange_http_critical` the longest per-rollout sum of delegation time spent in
HTTP and Redis rather than in the sub-agent's model (from its `Server-Timing` header). A restarted trainer resumes after the last step its
ledger holds, from that step's checkpoint.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from mgrpo.agents.agents import AgentLimits, Delegation, PlannerAgent, SingleAgent
from mgrpo.agents.loop import Transcript
from mgrpo.config import JobConfig
from mgrpo.role_model import RoleModel
from mgrpo.runtime import job_task
from mgrpo.sample import Sample, assign_advantages
from mgrpo.tasks.deep_research import Question, make_questions
from mgrpo.timing import PhaseTimer
from mgrpo.workflows.deep_research import callee_of, episodes_by_role, planner_samples
from planner_trainer.delegate import PartnerError, SubagentClient
from planner_trainer.root import Rollouts, RootJob
from shared_store import Store
from shared_store.schemas import (
    MetricsEvent,
    PlannerStepStats,
    PolicyVersion,
    QueryStats,
    RolloutStat,
)
from shared_store.streams import publish_metrics, publish_step


class PlannerJob(RootJob):
    def __init__(self, store: Store, job_id: str, cfg: JobConfig, *, cache_dir: Path, checkpoint_dir: Path,
                 callees: dict[str, SubagentClient], device: torch.device | str = "cpu", sglang_url: str = "") -> None:  # fmt: skip
        self.store, self.job_id, self.cfg, self.callees = store, job_id, cfg, callees
        self.remote = cfg.callee_trainers
        self.single = cfg.mode == "single_agent"
        self.task = job_task(cfg)
        last = store.ledger.last_step(job_id, "planner")
        self.m = RoleModel(cfg, "planner", cache_dir=cache_dir, checkpoint_dir=checkpoint_dir, job_id=job_id,
                           last_step=last, device=device, sglang_url=sglang_url, max_batch=256,
                           model_role="single" if self.single else "planner")  # fmt: skip
        self.start_step, self.engine, self.tokenizer = self.m.start_step, self.m.engine, self.m.tokenizer
        spec = self.m.spec
        self.limits = AgentLimits(10 if self.single else 6, spec.max_context_tokens * (2 if self.single else 1),
                                  spec.max_new_tokens_per_turn)  # fmt: skip
        store.policies.publish(
            PolicyVersion(job_id=job_id, role="planner", version=self.m.version, step=last)
        )

    def produce(self, step: int) -> Rollouts:
        timer = PhaseTimer()
        self.wait_bound(step, timer)
        questions = self._questions(step)
        with timer("rollout"):
            transcripts, delegations = self._rollouts(step, questions)
        with timer("reward"):
            qids = [f"q{qi}" for qi in range(len(questions))]
            samples, correct = planner_samples(qids, transcripts, [q.answer for q in questions], self.task.correct,
                                               self.cfg.rollouts_per_query, self.m.engine.weights_version)  # fmt: skip
        with timer("exchange_redis"):
            stats = self._query_stats(samples, correct, delegations)
            publish_step(self.store.client, "planner_stats", PlannerStepStats(job_id=self.job_id, step=step,
                         policy_version=self.version, queries=stats))  # fmt: skip
            self.store.accounts.record(self.job_id, "planner", step, produced=len(samples))
            for role in self.remote if self.cfg.mode == "co_train" else ():
                self.store.accounts.record(self.job_id, role, step, first_wins=True, produced=sum(
                    len(set(r.episodes.get(role, []))) for q in stats for r in q.rollouts))  # fmt: skip
        exchange = [sum(d.exchange_s for d in dels) for dels in delegations]  # sequential within a rollout
        every = [d for dels in delegations for d in dels]
        values = {
            "planner/reward_mean": float(np.mean([s.reward for s in samples])), "planner/success": float(np.mean(correct)),
            "planner/format_ok": float(np.mean([t.format_ok for t in transcripts])),
            "planner/delegations_mean": float(np.mean([len(d) for d in delegations])),
            "timing/exchange_http_critical": max(exchange, default=0.0),
            "exchange/delegation_ms_mean": 1e3 * float(np.mean([d.exchange_s for d in every] or [0.0])),
            "exchange/delegation_server_queue_ms_mean": 1e3 * float(np.mean([d.server_queue_s for d in every] or [0.0])),
        }  # fmt: skip
        return Rollouts(step, samples, timer, values)

    def train(self, rollouts: Rollouts) -> tuple[int, dict[str, float]]:
        step, samples, timer = rollouts.step, rollouts.samples, rollouts.timer
        with timer("adv"):
            adv = assign_advantages(samples)
        with timer("update"):
            metrics = self.m.update(samples, seed=step)
        with timer("checkpoint"):
            ckpt = self.m.save(step)
        with timer("exchange_redis"):
            self.account_trained("planner", step, len(samples), metrics)
            self._commit(step, ckpt.path)
        values = {
            **{f"planner/{k}": v for k, v in metrics.items()}, **rollouts.values,
            "planner/adv_std": float(adv.std()), "planner/version": float(self.version), **self.finish_values(rollouts),
        }  # fmt: skip
        publish_metrics(
            self.store.client, MetricsEvent(job_id=self.job_id, step=step, role="planner", values=values)
        )
        return step, values

    def _commit(self, step: int, ckpt: Path) -> None:
        """The step is done: ledger, policy version, progress (and garbage collection) in Redis."""
        self.store.commit_step(PolicyVersion(job_id=self.job_id, role="planner", version=self.version, step=step,
                                             checkpoint=str(ckpt)), roles=self.cfg.trainer_roles)  # fmt: skip

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
                                    temperature=self.m.spec.temperature, limits=self.limits)  # fmt: skip
                return agent.rollout(questions[qi].text), []
            return self._planner_rollout(step, qi, k, questions[qi])

        with ThreadPoolExecutor(max_workers=min(128, len(jobs))) as pool:
            results = list(pool.map(one, jobs))
        return [r[0] for r in results], [r[1] for r in results]

    def _planner_rollout(
        self, step: int, qi: int, k: int, q: Question
    ) -> tuple[Transcript, list[Delegation]]:
        calls = iter(range(10_000))

        def delegate(subtask: str) -> Delegation:
            role = callee_of(self.cfg.workflow, subtask)
            client = self.callees.get(role)
            if client is None:
                raise PartnerError(f"no {role} service configured (MGRPO_ROLE_URLS or MGRPO_SUBAGENT_URL)")
            body = {"job_id": self.job_id, "step": step, "query_id": f"q{qi}", "rollout": k, "call": next(calls),
                    "subtask": subtask}  # fmt: skip
            return client.episode(body)

        agent = PlannerAgent(
            self.engine,
            self.tokenizer,
            delegate,
            temperature=self.m.spec.temperature,
            limits=self.limits,
        )
        rollout = agent.rollout(q.text)
        return rollout.transcript, rollout.delegations

    def _query_stats(self, samples: list[Sample], correct: list[float], delegations: list[list[Delegation]]) -> list[QueryStats]:  # fmt: skip
        """The per-query outcomes the sub-agent's trainer reads (its rewards and alignment come from them)."""
        K, out = self.cfg.rollouts_per_query, []
        for qi in range(len(samples) // K):
            stats = [RolloutStat(rollout=k, reward=samples[qi * K + k].reward, correct=correct[qi * K + k],
                                 format_ok=samples[qi * K + k].transcript.format_ok,
                                 episodes=episodes_by_role(delegations[qi * K + k])) for k in range(K)]  # fmt: skip
            rr = np.array([s.reward for s in stats])
            out.append(QueryStats(query_id=samples[qi * K].group, rollouts=stats, reward_mean=float(rr.mean()),
                                  reward_std=float(rr.std())))  # fmt: skip
        return out

    def close(self) -> None:
        self.m.close()
