"""The MarsRL root (the solver): the `produce` half of its step (algorithm.md §9; `RootJob` owns the
set-up, the loop and the `train` half).

Per step s (phases timed as `timing/<name>`), produced (pipelined when max_staleness ≥ 1):
`wait_trainer`/`wait_partner` (every trainer applied step s − 1 − max_staleness) → `rollout` (the
grouped S → V → C → V → C program of `mgrpo.workflows.marsrl` over the step's problems; a role that
shares the root's model samples here, any other role is an HTTP call to its service, which records
the episode) → `reward` (agent-specific or outcome, filled by the program) → `exchange_redis` (each
callee role's scored groups to its `batch.<role>` stream, its training queue); then trained
(`RootJob.train`: the root's model on the samples of every role it holds). The job succeeds once
every callee applied the last step. With tracing on, each problem's chain is one trace: a `rollout`
span, its delegations' `delegate` spans and the callees' `episode` spans under it.
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mgrpo import tracing
from mgrpo.agents.agents import TurnAgent
from mgrpo.records import Sample, Transcript
from mgrpo.tasks.arithmetic import Problem, make_problems
from mgrpo.timing import PhaseTimer
from mgrpo.workflows.marsrl import Attempt, MarsSettings, Output, rollout_step, verification_metrics
from planner_trainer.root import Rollouts, RootJob
from shared_store import keys
from shared_store.schemas import EpisodeGroup, RoleBatch, ScoredEpisode

TRAIN_POOL = 3000  # train problems a job draws its steps from


class MarsRootJob(RootJob):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.local = self.job.root_roles
        spec = self.model.model_spec
        self.agents = {  # each local role samples from its model: the root's, or its own adapter's
            role: TurnAgent(
                self.heads[role].engine if role in self.heads else self.model.engine,
                self.model.tokenizer,
                temperature=spec.temperature,
                max_new_tokens=spec.max_new_tokens_per_turn,
            )
            for role in self.local
        }
        mc = self.cfg.marsrl
        self.settings = MarsSettings(
            self.cfg.rollouts_per_query,
            mc.select_k,
            mc.selection,
            mc.reward,
            mc.max_agent_steps,
            mc.calculator,
            seed=self.cfg.seed * 1_000_003 + self.cfg.run_seed,
        )
        self.pool = make_problems("train", TRAIN_POOL, seed=self.cfg.seed, n_ops=mc.n_ops)
        self.http = ThreadPoolExecutor(max_workers=128, thread_name_prefix="marsrl-http")

    def problems(self, step: int) -> list[Problem]:
        rng = random.Random(f"{self.cfg.seed}:{self.cfg.run_seed}:{step}")
        return rng.sample(self.pool, self.cfg.prompts_per_step)

    def produce(self, step: int) -> Rollouts:
        timer = PhaseTimer(job_id=self.job_id, step=step, role=self.root)
        self.wait_bound(step, timer)
        with timer("rollout"):
            attempts = rollout_step(
                self.problems(step),
                lambda *a: self._run(step, *a),
                self.settings,
                step,
                around=lambda p: tracing.span(
                    "rollout",
                    job_id=self.job_id,
                    step=step,
                    role=self.root,
                    query_id=p.pid,
                    policy_version=self.version,
                ),
            )
        fallback = self.model.engine.weights_version
        samples = [
            Sample(a.role, a.group, a.ref, a.reward, policy_version=_version(a.ref, fallback))
            for a in attempts
            if a.role in self.local and isinstance(a.ref, Transcript)
        ]
        values = attempt_metrics(self.job.flow.role_names, attempts)
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

    def _run(self, step: int, role: str, prompt: str, n: int, group: str) -> list[Output]:
        """n outputs of `role` on one input: sampled here when the root holds the role's model, else
        n episodes on the role's service (recorded there under `s<step>-<group>-r<i>-c0`)."""
        if role in self.local:
            return [Output(text, tr) for text, tr in self.agents[role].sample(prompt, n)]
        client = self.callees[role]
        body = {"job_id": self.job_id, "step": step, "query_id": group, "call": 0, "subtask": prompt}
        call = tracing.carry(lambda i: client.episode({**body, "rollout": i}))  # in the problem's trace
        done = list(self.http.map(call, range(n)))
        return [Output(d.result, d.episode_id or "") for d in done]

    def close(self) -> None:
        self.http.shutdown(wait=False, cancel_futures=True)
        super().close()


def _version(ref: Transcript, fallback: int) -> int:
    """The policy version a local attempt's transcript was sampled from."""
    return fallback if ref.policy_version is None else ref.policy_version


def role_batch(job_id: str, step: int, version: int, role: str, attempts: list[Attempt]) -> RoleBatch:
    """One callee role's scored groups of a step (empty when the chain never reached the role)."""
    groups: dict[str, list[ScoredEpisode]] = {}
    for a in attempts:
        if a.role == role and isinstance(a.ref, str):  # recorded by the role's service
            groups.setdefault(a.group, []).append(ScoredEpisode(episode_id=a.ref, reward=a.reward))
    return RoleBatch(
        job_id=job_id,
        step=step,
        policy_version=version,
        role=role,
        groups=[EpisodeGroup(group=g, episodes=e) for g, e in groups.items()],
    )


def attempt_metrics(roles: tuple[str, ...], attempts: list[Attempt]) -> dict[str, float]:
    """Per role: mean reward, samples, groups, format rate; the answer's accuracy of the roles that
    answer, the share of verdicts that say Wrong of those that judge; and the verifier's recall per
    class and the corrector's fix / break rates (`verification_metrics`)."""
    out: dict[str, float] = {}
    for role in roles:
        mine = [a for a in attempts if a.role == role]
        if not mine:
            continue
        out[f"{role}/reward_mean"] = float(np.mean([a.reward for a in mine]))
        out[f"{role}/samples"] = float(len(mine))
        out[f"{role}/groups"] = float(len({a.group for a in mine}))
        out[f"{role}/format_ok"] = float(np.mean([a.turn.format_ok for a in mine]))
        if any(a.judges for a in mine):
            out[f"{role}/flagged_wrong"] = float(np.mean([a.verdict is False for a in mine]))
        else:
            out[f"{role}/accuracy"] = float(np.mean([a.correct for a in mine]))
    return out | verification_metrics(attempts)
