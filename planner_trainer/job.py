"""One job on the planner service: the step loop.

Per step s (phases timed by `PhaseTimer` as `timing/<name>`), produced (`RootJob`: pipelined when
max_staleness ≥ 1): `wait_trainer`/`wait_partner` (every trainer applied step s − 1 − max_staleness)
→ `rollout` (K rollouts of each query, all concurrent, every delegation an HTTP call to the sub-agent
service) → `reward` (R_M, algorithm.md §2) → per-query statistics to Redis (the sub-agent's training queue);
then trained: `adv` (over each query's K rollouts, algorithm.md §4) → `update` (clipped PPO, algorithm.md §5) →
`checkpoint` → ledger, policy version, progress. `exchange_redis` is the Redis time on this path (statistics, ledger,
version, progress); `exchange_http_critical` the longest per-rollout sum of delegation time spent in
HTTP and Redis rather than in the sub-agent's model (from its `Server-Timing` header). A restarted trainer resumes after the last step its
ledger holds, from that step's checkpoint.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mgrpo.advantages import assign_advantages
from mgrpo.agents.agents import AgentLimits, Delegation, PlannerAgent, SingleAgent
from mgrpo.agents.chat import ChatAgent, ChatFormat, first_string, is_chat_model, tool_schemas
from mgrpo.config import JobConfig
from mgrpo.datasets import check_splits, rows_of
from mgrpo.records import Sample, Transcript
from mgrpo.role_model import RoleModel
from mgrpo.runtime import job_task
from mgrpo.scoring import Item, Scorer, Scores
from mgrpo.tasks.deep_research import Question, dataset_questions, epoch_sample, make_questions
from mgrpo.timing import PhaseTimer
from mgrpo.tools import ToolBox
from mgrpo.workflows.deep_research import callee_of, episodes_by_role, finite_mean, planner_samples
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
from shared_store.streams import publish_metrics

log = logging.getLogger("mgrpo.planner")
# Delegations of held-out evaluation and of POST /v1/rollouts are recorded under these steps; no trainer reads them.
EVAL_STEP, PROBE_STEP = 999_998, 999_999


class PlannerJob(RootJob):
    def __init__(
        self,
        store: Store,
        job_id: str,
        cfg: JobConfig,
        *,
        cache_dir: Path,
        checkpoint_dir: Path,
        callees: dict[str, SubagentClient],
        device: torch.device | str = "cpu",
        sglang_url: str = "",
        sglang_sync_host: str = "",
    ) -> None:
        self.store, self.job_id, self.cfg, self.callees = store, job_id, cfg, callees
        self.remote = cfg.callee_trainers
        self.single = cfg.mode == "single_agent"
        self.task = job_task(cfg)
        self.pool, self.held_out = self._dataset()
        self.scorer = Scorer(cfg.reward, device=device)
        self.tools = ToolBox(cfg.tools_of("planner") if self.single else [], self.task.tools)
        last = store.ledger.last_step(job_id, "planner")
        self.m = RoleModel(
            cfg,
            "planner",
            cache_dir=cache_dir,
            checkpoint_dir=checkpoint_dir,
            job_id=job_id,
            last_step=last,
            device=device,
            sglang_url=sglang_url,
            sglang_sync_host=sglang_sync_host,
            max_batch=256,
            model_role="single" if self.single else "planner",
        )
        self.start_step, self.engine, self.tokenizer = self.m.start_step, self.m.engine, self.m.tokenizer
        spec = self.m.spec
        self.limits = AgentLimits(
            10 if self.single else 6,
            spec.max_context_tokens * (2 if self.single else 1),
            spec.max_new_tokens_per_turn,
        )
        store.policies.publish(
            PolicyVersion(job_id=job_id, role="planner", version=self.m.version, step=last)
        )
        self.chat = (
            None
            if not is_chat_model(self.tokenizer) or self.single
            else ChatFormat(
                self.tokenizer,
                tool_schemas([("delegate", "builtin")]),
                parser=spec.tool_parser,
                keep_thinking=spec.keep_thinking,
                terminal="answer",
            )
        )

    def produce(self, step: int) -> Rollouts:
        timer = PhaseTimer()
        self.wait_bound(step, timer)
        questions = self._questions(step)
        with timer("rollout"):
            transcripts, delegations = self._rollouts(step, questions)
        with timer("reward"):
            qids = [f"q{qi}" for qi in range(len(questions))]
            scores = self._score(questions, transcripts, self.cfg.rollouts_per_query)
            samples, correct = planner_samples(
                qids, transcripts, scores.values, self.cfg.rollouts_per_query, self.m.engine.weights_version
            )
        exchange = [sum(d.exchange_s for d in dels) for dels in delegations]  # sequential within a rollout
        every = [d for dels in delegations for d in dels]
        values = {
            "planner/reward_mean": finite_mean([s.reward for s in samples]),
            "planner/success": finite_mean(correct),
            "planner/reward_rejected": float(scores.rejected),
            "planner/reward_errors": float(scores.errors),
            "planner/format_ok": float(np.mean([t.format_ok for t in transcripts])),
            "planner/delegations_mean": float(np.mean([len(d) for d in delegations])),
            **({f"planner/{k}": v for k, v in self.tools.take_counts().items()} if self.single else {}),
            "timing/exchange_http_critical": max(exchange, default=0.0),
            "exchange/delegation_ms_mean": 1e3 * float(np.mean([d.exchange_s for d in every] or [0.0])),
            "exchange/delegation_server_queue_ms_mean": 1e3
            * float(np.mean([d.server_queue_s for d in every] or [0.0])),
        }
        with timer("exchange_redis"):
            stats = self._query_stats(samples, correct, delegations)
            message = PlannerStepStats(
                job_id=self.job_id, step=step, policy_version=self.version, queries=stats
            )
            produced = {
                role: sum(len(set(r.episodes.get(role, []))) for q in stats for r in q.rollouts)
                for role in (self.remote if self.cfg.mode == "co_train" else ())
            }
            self.publish_produced(step, [("planner_stats", message)], samples, values, produced)
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
            **{f"planner/{k}": v for k, v in metrics.items()},
            **rollouts.values,
            "planner/adv_std": float(adv.std()),
            "planner/version": float(self.version),
            **self.finish_values(rollouts),
        }
        publish_metrics(
            self.store.client, MetricsEvent(job_id=self.job_id, step=step, role="planner", values=values)
        )
        return step, values

    def _commit(self, step: int, ckpt: Path) -> None:
        """The step is done: ledger, policy version, progress (and garbage collection) in Redis."""
        self.store.commit_step(
            PolicyVersion(
                job_id=self.job_id,
                role="planner",
                version=self.version,
                step=step,
                checkpoint=self.m.shown(ckpt),
            ),
            roles=self.cfg.trainer_roles,
        )

    def _dataset(self) -> tuple[list[Question], list[Question]]:
        """The job's dataset: its train split's and (the first `eval_queries` of) its held-out split's
        questions; none without a dataset (the built-in world's questions)."""
        d = self.cfg.dataset
        if d is None:
            return [], []
        rows = rows_of(d.source, self.store.datasets.content)
        check_splits(rows, d.train_split, d.eval_split)
        held_out = dataset_questions(rows, d.eval_split)[: d.eval_queries] if d.eval_split else []
        return dataset_questions(rows, d.train_split), held_out

    def _questions(self, step: int) -> list[Question]:
        if self.pool:
            return epoch_sample(
                self.pool, step, self.cfg.prompts_per_step, seed=f"{self.cfg.seed}:{self.cfg.run_seed}"
            )
        seed = random.Random(f"{self.cfg.seed}:{self.cfg.run_seed}:{step}").randrange(2**31)
        return make_questions(self.task.world, "train", self.cfg.stage, self.cfg.prompts_per_step, seed=seed)

    def _score(self, questions: list[Question], transcripts: list[Transcript], k: int) -> Scores:
        """Each rollout's `correct` (rollout i answers question i // k) by the job's scorer; malformed
        rollouts are not scored (R_M is 0); rejected rewards are told in the job's events."""
        values = [0.0] * len(transcripts)
        scored = [i for i, tr in enumerate(transcripts) if tr.format_ok]
        q = [questions[i // k] for i in scored]
        scores = self.scorer(
            [Item(x.text, transcripts[i].final or "", x.answer) for i, x in zip(scored, q, strict=True)]
        )
        for i, v in zip(scored, scores.values, strict=True):
            values[i] = v
        for message in scores.messages:
            log.warning("job %s: %s", self.job_id, message)
            publish_metrics(
                self.store.client,
                MetricsEvent(job_id=self.job_id, step=-1, role="planner", kind="event", message=message),
            )
        return Scores(values, scores.rejected, scores.errors, scores.messages)

    # ---- held-out evaluation (a dataset with an eval split) ---------------------------------------
    def run(self, on_step: Callable[[int, dict[str, float]], None] | None = None) -> None:
        before = self.evaluate() if self.held_out and self.start_step == 0 else None
        super().run(on_step)
        if self.held_out:
            after = self.evaluate()
            values = {f"{k}_after": v for k, v in after.items()}
            if before is not None:
                values |= {f"{k}_before": v for k, v in before.items()}
                values["success_gain"] = after["success"] - before["success"]
            publish_metrics(
                self.store.client,
                MetricsEvent(job_id=self.job_id, step=self.cfg.steps - 1, role="eval", values=values),
            )

    def evaluate(self) -> dict[str, float]:
        """Greedy rollouts of the held-out questions with the current policy: success (the job's
        scorer) and format rate. Delegations are recorded under a step no trainer reads."""
        items = [(qi, q) for qi, q in enumerate(self.held_out)]
        with ThreadPoolExecutor(max_workers=min(64, len(items))) as pool:
            transcripts = list(
                pool.map(lambda it: self.rollout(EVAL_STEP, f"eval{it[0]}", 0, it[1], 0.0)[0], items)
            )
        scores = self._score(self.held_out, transcripts, 1)
        return {
            "success": finite_mean(scores.values),
            "format_ok": float(np.mean([t.format_ok for t in transcripts])),
            "queries": float(len(items)),
            "reward_rejected": float(scores.rejected),
        }

    def _rollouts(
        self, step: int, questions: list[Question]
    ) -> tuple[list[Transcript], list[list[Delegation]]]:
        jobs = [(qi, k) for qi in range(len(questions)) for k in range(self.cfg.rollouts_per_query)]

        def one(item: tuple[int, int]) -> tuple[Transcript, list[Delegation]]:
            qi, k = item
            return self.rollout(step, f"q{qi}", k, questions[qi], self.m.spec.temperature)

        results = list(self.rollout_pool.map(one, jobs))
        return [r[0] for r in results], [r[1] for r in results]

    def rollout(
        self, step: int, query_id: str, k: int, q: Question, temperature: float
    ) -> tuple[Transcript, list[Delegation]]:
        """One rollout of a question: the planner's, each delegation an episode of `step` recorded by
        the callee's service; or the single agent's."""
        if self.single:
            single = SingleAgent(
                self.engine, self.tokenizer, self.tools, temperature=temperature, limits=self.limits
            )
            return single.rollout(q.text), []
        calls = iter(range(10_000))

        def delegate(subtask: str) -> Delegation:
            role = callee_of(self.cfg.engine, subtask)
            client = self.callees.get(role)
            if client is None:
                raise PartnerError(f"no {role} service configured (MGRPO_ROLE_URLS or MGRPO_SUBAGENT_URL)")
            body = {
                "job_id": self.job_id,
                "step": step,
                "query_id": query_id,
                "rollout": k,
                "call": next(calls),
                "subtask": subtask,
            }
            return client.episode(body)

        if self.chat is None:
            agent = PlannerAgent(
                self.engine, self.tokenizer, delegate, temperature=temperature, limits=self.limits
            )
            rollout = agent.rollout(q.text)
            return rollout.transcript, rollout.delegations
        delegations: list[Delegation] = []

        def call(name: str, arguments: dict[str, Any]) -> str:  # a chat planner delegates through a tool
            if name != "delegate":
                return f"unknown tool {name!r}; tools: delegate"
            delegations.append(delegate(first_string(arguments)))
            return delegations[-1].result

        chat = ChatAgent(
            self.engine,
            self.chat,
            call,
            temperature=temperature,
            max_turns=self.limits.max_turns,
            max_context_tokens=self.limits.max_context_tokens,
            max_new_tokens_per_turn=self.limits.max_new_tokens_per_turn,
        )
        return chat.run(q.text), delegations

    def _query_stats(
        self, samples: list[Sample], correct: list[float], delegations: list[list[Delegation]]
    ) -> list[QueryStats]:
        """The per-query outcomes the sub-agent's trainer reads (its rewards and alignment come from them)."""
        K, out = self.cfg.rollouts_per_query, []
        for qi in range(len(samples) // K):
            stats = [
                RolloutStat(
                    rollout=k,
                    reward=samples[qi * K + k].reward,
                    correct=correct[qi * K + k],
                    format_ok=samples[qi * K + k].transcript.format_ok,
                    episodes=episodes_by_role(delegations[qi * K + k]),
                )
                for k in range(K)
            ]
            rr = np.array([s.reward for s in stats])
            out.append(
                QueryStats(
                    query_id=samples[qi * K].group,
                    rollouts=stats,
                    reward_mean=float(rr.mean()),
                    reward_std=float(rr.std()),
                )
            )
        return out

    def close(self) -> None:
        self.tools.close()
        self.scorer.close()
        self.m.close()
