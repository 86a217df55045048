"""One job on the sub-agent service: the model, its engine and optimizer, episode serving, and the
training step that consumes the planner's per-step statistics.

Step s (phases timed under these names): `align` (per query, each rollout's episodes aligned to D
slots, SPEC §4) → `reward` (R_S = format gate + β·(1, correct_main, expert), SPEC §3) → `adv`
(pooled over the query's K·D samples, SPEC §5) → `update` (clipped PPO, SPEC §6; skipped in
main_only) → manifest and statistics to Redis → `checkpoint` → policy version. `exchange_redis` is
the Redis time of the step (episode fetch, manifest, statistics, version).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from mgrpo.agents.agents import AgentLimits, SubAgent
from mgrpo.agents.loop import Transcript
from mgrpo.algo import align_episodes, alignment_seed, group_advantages, subagent_reward
from mgrpo.checkpoint import latest_checkpoint, restore_trainer_state, save_checkpoint
from mgrpo.config import JobConfig
from mgrpo.models import load, place
from mgrpo.runtime import job_task, reference_model, role_model_source, rollout_engine
from mgrpo.training import UpdateSettings, ppo_update
from shared_store import EpisodeArrays, Store
from shared_store.schemas import (
    AlignedBatchManifest,
    AlignedQuery,
    EpisodeMeta,
    MetricsEvent,
    PlannerStepStats,
    PolicyVersion,
    SubagentQueryStats,
    SubagentStepStats,
    episode_id,
)
from shared_store.streams import publish_metrics, publish_step


class SubagentJob:
    def __init__(self, store: Store, job_id: str, cfg: JobConfig, *, cache_dir: Path, checkpoint_dir: Path,
                 device: torch.device | str = "cpu", sglang_url: str = "") -> None:  # fmt: skip
        self.store, self.job_id, self.cfg = store, job_id, cfg
        self.ckpt_root = checkpoint_dir / job_id / "subagent"
        self.task = job_task(cfg)
        last = store.ledger.last_step(job_id, "subagent")
        resume = latest_checkpoint(self.ckpt_root, step=last) if last >= 0 else None
        source = str(resume.path) if resume else role_model_source(cfg, "subagent", cache_dir)
        model, self.tokenizer = load(source)
        self.model = place(model, device).eval()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.subagent_optim.lr, weight_decay=0.0
        )
        if resume:
            restore_trainer_state(resume, self.optimizer)
        self.version = resume.version if resume else 0
        self._fetch_s = 0.0
        self.engine = rollout_engine(self.model, self.tokenizer, sglang_url, weights=source)
        spec = cfg.subagent
        self.agent = SubAgent(self.engine, self.tokenizer, self.task.call_tool, temperature=spec.temperature,
                              limits=AgentLimits(4, spec.max_context_tokens, spec.max_new_tokens_per_turn))  # fmt: skip
        o = cfg.subagent_optim
        self.update_settings = UpdateSettings.of(o, spec.temperature)
        self.ref_model = reference_model(cfg, "subagent", cache_dir, device)
        store.policies.publish(PolicyVersion(job_id=job_id, role="subagent", version=self.version, step=last))

    # ---- serving ------------------------------------------------------------------------------------
    def run_episode(
        self, step: int, query_id: str, rollout: int, call: int, subtask: str
    ) -> tuple[EpisodeMeta, float]:
        """Run one delegated subtask with the current policy and record it (arrays + meta) in Redis.
        Returns the episode's metadata and the seconds the Redis write took."""
        version = self.version
        tr = self.agent.run(subtask)
        expert = self.task.judge(subtask, tr.final or "") if tr.format_ok else 0.0
        meta = EpisodeMeta(
            job_id=self.job_id, step=step, policy_version=version, episode_id=episode_id(step, query_id, rollout, call),
            query_id=query_id, rollout=rollout, call=call, n_tokens=len(tr), format_ok=tr.format_ok,
            expert_score=None if math.isnan(expert) else expert, finish_reason=tr.finish, subtask=subtask,
            result=tr.final if tr.format_ok and tr.final else "no result",
        )  # fmt: skip
        t0 = time.perf_counter()
        meta = self.store.episodes.put(meta, EpisodeArrays.of(tr.token_ids, tr.logp, tr.mask))
        return meta, time.perf_counter() - t0

    # ---- training -----------------------------------------------------------------------------------
    def train_step(self, stats: PlannerStepStats) -> int:
        """Consume the planner's statistics of one step; returns the policy version it produced."""
        t0 = time.perf_counter()
        samples, rewards, groups, manifest_queries, query_stats, empty = self._align(stats)
        t_align = time.perf_counter()
        adv = (
            group_advantages(torch.tensor(rewards, dtype=torch.float32), torch.tensor(groups))
            if rewards
            else torch.zeros(0)
        )
        t_adv = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.cfg.mode == "co_train" and samples:
            with self.engine.paused():
                metrics = ppo_update(self.model, self.optimizer, list(zip(samples, adv.tolist(), strict=True)),
                                     self.update_settings, pad_id=int(self.tokenizer.pad_token_id), seed=stats.step,
                                     ref_model=self.ref_model)  # fmt: skip
            self.version += 1
        t_update = time.perf_counter()
        self._publish(stats.step, manifest_queries, adv.tolist(), query_stats, empty)
        t_pub = time.perf_counter()
        ckpt = save_checkpoint(self.ckpt_root, self.model, self.tokenizer, self.optimizer, step=stats.step,
                               version=self.version, keep_every_steps=self.cfg.checkpoint_keep_every_steps)  # fmt: skip
        if metrics and not self.engine.shares_weights:  # updated, and served by SGLang: push the weights
            self.engine.update_weights(str(ckpt.path))
        t_ckpt = time.perf_counter()
        self.store.policies.publish(PolicyVersion(job_id=self.job_id, role="subagent", version=self.version,
                                                  step=stats.step, checkpoint=str(ckpt.path)))  # fmt: skip
        t_end = time.perf_counter()
        r = np.array([x for x in rewards if not math.isnan(x)] or [0.0])
        values = {
            **{f"subagent/{k}": v for k, v in metrics.items()},
            "subagent/reward_mean": float(r.mean()), "subagent/reward_std": float(r.std()),
            "subagent/adv_std": float(adv.std()) if len(adv) > 1 else 0.0, "subagent/samples": float(len(samples)),
            "subagent/queries_without_episodes": float(empty), "subagent/version": float(self.version),
            "timing/subagent_align": t_align - t0, "timing/subagent_adv": t_adv - t_align,
            "timing/subagent_update": t_update - t_adv, "timing/subagent_checkpoint": t_ckpt - t_pub,
            "timing/subagent_exchange_redis": self._fetch_s + (t_pub - t_update) + (t_end - t_ckpt),
            "timing/subagent_step": t_end - t0,
        }  # fmt: skip
        self._emit(stats.step, values, ckpt.path)
        self.store.progress.advance(self.job_id, "subagent", stats.step)
        self.store.progress.collect(self.job_id, keep_steps=1)
        return self.version

    def _align(self, stats: PlannerStepStats) -> tuple[list[Transcript], list[float], list[int], list[AlignedQuery], list[SubagentQueryStats], int]:  # fmt: skip
        samples: list[Transcript] = []
        rewards: list[float] = []
        groups: list[int] = []
        manifest: list[AlignedQuery] = []
        qstats: list[SubagentQueryStats] = []
        empty = 0
        self._fetch_s = 0.0  # Redis time fetching this step's episodes
        for gi, q in enumerate(stats.queries):
            slots = align_episodes([len(r.episode_ids) for r in q.rollouts], self.cfg.subagent_slots_per_rollout,
                                   seed=alignment_seed(self.cfg.seed, stats.step, f"{q.query_id}@run{self.cfg.run_seed}"), mode=self.cfg.alignment)  # fmt: skip
            ids = [[q.rollouts[k].episode_ids[i] for k, i in rs] for rs in slots]
            flat = [e for rs in ids for e in rs]
            if not flat:
                empty += 1
                continue
            t_fetch = time.perf_counter()
            fetched = dict(
                zip(flat, self.store.episodes.get_many(self.job_id, stats.step, flat), strict=True)
            )
            self._fetch_s += time.perf_counter() - t_fetch
            first = len(rewards)
            for rs in slots:
                for k, i in rs:
                    meta, arr = fetched[q.rollouts[k].episode_ids[i]]
                    samples.append(
                        Transcript(arr.token_ids.tolist(), arr.logp.tolist(), arr.loss_mask.tolist(), 0)
                    )
                    expert = math.nan if meta.expert_score is None else meta.expert_score
                    rewards.append(subagent_reward(meta.format_ok, q.rollouts[k].correct, expert))
                    groups.append(gi)
            manifest.append(
                AlignedQuery(query_id=q.query_id, slots=ids, advantages=[[0.0] * len(rs) for rs in ids])
            )
            r = np.array([x for x in rewards[first:] if not math.isnan(x)] or [0.0])
            n_eps = sum(len(ro.episode_ids) for ro in q.rollouts)
            qstats.append(SubagentQueryStats(query_id=q.query_id, n_episodes=n_eps, n_samples=len(rewards) - first,
                                             reward_mean=float(r.mean()), reward_std=float(r.std())))  # fmt: skip
        return samples, rewards, groups, manifest, qstats, empty

    def _publish(self, step: int, queries: list[AlignedQuery], adv: list[float], qstats: list[SubagentQueryStats], empty: int) -> None:  # fmt: skip
        it = iter(adv)
        filled = [
            q.model_copy(update={"advantages": [[next(it) for _ in rs] for rs in q.slots]}) for q in queries
        ]
        common = {"job_id": self.job_id, "step": step, "policy_version": self.version}
        publish_step(self.store.client, "manifests", AlignedBatchManifest(
            **common, mode=self.cfg.alignment, slots_per_rollout=self.cfg.subagent_slots_per_rollout, queries=filled))  # fmt: skip
        publish_step(
            self.store.client,
            "subagent_stats",
            SubagentStepStats(**common, queries=qstats, queries_without_episodes=empty),
        )

    def _emit(self, step: int, values: dict[str, float], ckpt: Path) -> None:
        publish_metrics(
            self.store.client, MetricsEvent(job_id=self.job_id, step=step, role="subagent", values=values)
        )
        publish_metrics(self.store.client, MetricsEvent(job_id=self.job_id, step=step, role="subagent", kind="event",
                        message=str(ckpt), values={"checkpoint": 1.0, "version": float(self.version)}))  # fmt: skip

    def close(self) -> None:
        self.engine.close()
