"""One MarsRL job on the root (solver) service: the step loop (algorithm.md §9).

Per step s (phases timed as `timing/<name>`), produced (`RootJob`: pipelined when max_staleness ≥ 1):
`wait_trainer`/`wait_partner` (every trainer applied step s − 1 − max_staleness) → `rollout` (the grouped S → V → C → V → C program of `mgrpo.workflows.marsrl`
over the step's problems; a role that shares the root's model samples here, any other role is an
HTTP call to its service, which records the episode) → `reward` (agent-specific or outcome, filled by
the program) → `exchange_redis` (each callee role's scored groups to its `batch.<role>` stream, its
training queue); then trained: `adv` (per (role, group)) → `update` (the root's model on the samples of every role it holds) →
`checkpoint` → ledger, policy version, progress. The job succeeds once every callee applied the last
step.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from mgrpo.advantages import assign_advantages
from mgrpo.agents.agents import TurnAgent
from mgrpo.config import JobConfig
from mgrpo.records import Sample
from mgrpo.role_model import RoleModel
from mgrpo.tasks.arithmetic import Problem, make_problems
from mgrpo.timing import PhaseTimer
from mgrpo.workflows import MARSRL
from mgrpo.workflows.marsrl import Attempt, MarsSettings, Output, rollout_step
from planner_trainer.delegate import PartnerError, SubagentClient
from planner_trainer.root import Rollouts, RootJob
from shared_store import Store, keys
from shared_store.schemas import EpisodeGroup, MetricsEvent, PolicyVersion, RoleBatch, ScoredEpisode
from shared_store.streams import publish_metrics

TRAIN_POOL = 3000  # train problems a job draws its steps from


class MarsRootJob(RootJob):
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
        self.store, self.job_id, self.cfg = store, job_id, cfg
        self.root, self.local = cfg.flow.root, cfg.root_roles
        self.remote = cfg.callee_trainers
        missing = [r for r in self.remote if r not in callees]
        if missing:
            raise PartnerError(f"no service configured for role(s) {', '.join(missing)} (MGRPO_ROLE_URLS)")
        self.callees = callees
        last = store.ledger.last_step(job_id, self.root)
        self.m = RoleModel(
            cfg,
            self.root,
            cache_dir=cache_dir,
            checkpoint_dir=checkpoint_dir,
            job_id=job_id,
            last_step=last,
            device=device,
            sglang_url=sglang_url,
            sglang_sync_host=sglang_sync_host,
            max_batch=256,
        )
        self.agent = TurnAgent(
            self.m.engine,
            self.m.tokenizer,
            temperature=self.m.spec.temperature,
            max_new_tokens=self.m.spec.max_new_tokens_per_turn,
        )
        mc = cfg.marsrl
        self.settings = MarsSettings(
            cfg.rollouts_per_query,
            mc.select_k,
            mc.selection,
            mc.reward,
            mc.max_agent_steps,
            seed=cfg.seed * 1_000_003 + cfg.run_seed,
        )
        self.pool = make_problems("train", TRAIN_POOL, seed=cfg.seed, n_ops=mc.n_ops)
        self.http = ThreadPoolExecutor(max_workers=128, thread_name_prefix="marsrl-http")
        self.start_step = self.m.start_step
        store.policies.publish(
            PolicyVersion(job_id=job_id, role=self.root, version=self.m.version, step=last)
        )

    def problems(self, step: int) -> list[Problem]:
        rng = random.Random(f"{self.cfg.seed}:{self.cfg.run_seed}:{step}")
        return rng.sample(self.pool, self.cfg.prompts_per_step)

    def produce(self, step: int) -> Rollouts:
        timer = PhaseTimer()
        self.wait_bound(step, timer)
        with timer("rollout"):
            attempts = rollout_step(self.problems(step), lambda *a: self._run(step, *a), self.settings, step)
        samples = [
            Sample(
                a.role,
                a.group,
                a.ref,
                a.reward,
                policy_version=_version(a.ref, self.m.engine.weights_version),
            )
            for a in attempts
            if a.role in self.local
        ]
        values = attempt_metrics(attempts)
        with timer("exchange_redis"):
            batches = {
                role: role_batch(self.job_id, step, self.version, role, attempts) for role in self.remote
            }
            produced = {
                role: len({e.episode_id for g in b.groups for e in g.episodes}) for role, b in batches.items()
            }
            messages = [(keys.batch_stream(role), b) for role, b in batches.items()]
            self.publish_produced(step, messages, samples, values, produced)
        return Rollouts(step, samples, timer, values)

    def train(self, rollouts: Rollouts) -> tuple[int, dict[str, float]]:
        step, samples, timer = rollouts.step, rollouts.samples, rollouts.timer
        with timer("adv"):
            assign_advantages(samples)
        with timer("update"):
            metrics = self.m.update(samples, seed=step)
        with timer("checkpoint"):
            ckpt = self.m.save(step)
        with timer("exchange_redis"):
            self.account_trained(self.root, step, len(samples), metrics)
            self.store.commit_step(
                PolicyVersion(
                    job_id=self.job_id,
                    role=self.root,
                    version=self.version,
                    step=step,
                    checkpoint=self.m.shown(ckpt.path),
                ),
                roles=self.cfg.trainer_roles,
            )
        values = {
            **{f"{self.root}/{k}": v for k, v in metrics.items()},
            **rollouts.values,
            f"{self.root}/version": float(self.version),
            **self.finish_values(rollouts),
        }
        publish_metrics(
            self.store.client, MetricsEvent(job_id=self.job_id, step=step, role=self.root, values=values)
        )
        return step, values

    def _run(self, step: int, role: str, prompt: str, n: int, group: str) -> list[Output]:
        """n outputs of `role` on one input: sampled here when the root holds the role's model, else
        n episodes on the role's service (recorded there under `s<step>-<group>-r<i>-c0`)."""
        if role in self.local:
            return [Output(text, tr) for text, tr in self.agent.sample(prompt, n)]
        client = self.callees[role]
        body = {"job_id": self.job_id, "step": step, "query_id": group, "call": 0, "subtask": prompt}
        done = list(self.http.map(lambda i: client.episode({**body, "rollout": i}), range(n)))
        return [Output(d.result, d.episode_id) for d in done]

    def close(self) -> None:
        self.http.shutdown(wait=False, cancel_futures=True)
        self.m.close()


def _version(ref: object, fallback: int) -> int:
    """The policy version a local attempt's transcript was sampled from."""
    v = getattr(ref, "policy_version", None)
    return fallback if v is None else int(v)


def role_batch(job_id: str, step: int, version: int, role: str, attempts: list[Attempt]) -> RoleBatch:
    """One callee role's scored groups of a step (empty when the chain never reached the role)."""
    groups: dict[str, list[ScoredEpisode]] = {}
    for a in attempts:
        if a.role == role:
            groups.setdefault(a.group, []).append(ScoredEpisode(episode_id=str(a.ref), reward=a.reward))
    return RoleBatch(
        job_id=job_id,
        step=step,
        policy_version=version,
        role=role,
        groups=[EpisodeGroup(group=g, episodes=e) for g, e in groups.items()],
    )


def attempt_metrics(attempts: list[Attempt]) -> dict[str, float]:
    """Per role: mean reward, samples, groups, format rate; the solver's and correctors' accuracy and
    the share of verifier verdicts that agree with the truth."""
    out: dict[str, float] = {}
    for role in MARSRL.role_names:
        mine = [a for a in attempts if a.role == role]
        if not mine:
            continue
        out[f"{role}/reward_mean"] = float(np.mean([a.reward for a in mine]))
        out[f"{role}/samples"] = float(len(mine))
        out[f"{role}/groups"] = float(len({a.group for a in mine}))
        out[f"{role}/format_ok"] = float(np.mean([a.turn.format_ok for a in mine]))
        if role != "verifier":
            out[f"{role}/accuracy"] = float(np.mean([a.correct for a in mine]))
        else:
            out["verifier/flagged_wrong"] = float(np.mean([a.verdict is False for a in mine]))
    return out
