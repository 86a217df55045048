"""The questions of a root that answers queries (the deep-research planner, an agent program): a
user dataset's train split (and its held-out split) or the built-in world's generated questions;
each rollout's final answer scored by the job's reward; the held-out evaluation before the first step
and after the last. The root jobs hold one `Queries` (composition), each with its own rollout."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mgrpo.config import JobConfig
from mgrpo.datasets import check_splits, rows_of
from mgrpo.records import Transcript
from mgrpo.scoring import Item, Scorer, Scores
from mgrpo.tasks.deep_research import (
    DeepResearchTask,
    Question,
    dataset_questions,
    epoch_sample,
    make_questions,
)
from mgrpo.workflows.deep_research import QueryRollouts, finite_mean
from shared_store import Store
from shared_store.schemas import MetricsEvent

log = logging.getLogger("mgrpo.root")
# Delegations of held-out evaluation and of POST /v1/rollouts are recorded under these steps; no trainer
# reads them.
EVAL_STEP, PROBE_STEP = 999_998, 999_999


class Queries:
    def __init__(
        self,
        store: Store,
        job_id: str,
        cfg: JobConfig,
        task: DeepResearchTask,
        *,
        root: str,
        device: Any,
        emit: Callable[[MetricsEvent], None],
        event: Callable[[str], None],
    ) -> None:
        """`root`: the role whose answers are scored; `emit` publishes the evaluation's record, `event`
        a line in the job's events (`RootJob.emit`, `RootJob.event`)."""
        self.store, self.job_id, self.cfg, self.task, self.root = store, job_id, cfg, task, root
        self.emit, self.event = emit, event
        self.scorer = Scorer(cfg.reward, device=device)
        self.pool, self.held_out = self._dataset()

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

    def for_step(self, step: int) -> list[Question]:
        if self.pool:
            return epoch_sample(
                self.pool, step, self.cfg.prompts_per_step, seed=f"{self.cfg.seed}:{self.cfg.run_seed}"
            )
        seed = random.Random(f"{self.cfg.seed}:{self.cfg.run_seed}:{step}").randrange(2**31)
        return make_questions(self.task.world, "train", self.cfg.stage, self.cfg.prompts_per_step, seed=seed)

    def score(self, queries: list[QueryRollouts]) -> Scores:
        """Fill each rollout's `correct` with the job's scorer (a malformed rollout is not scored: 0);
        rejected rewards are told in the job's events."""
        rollouts = [(q.question, r) for q in queries for r in q.rollouts]
        for _, r in rollouts:
            r.correct = 0.0
        scored = [(question, r) for question, r in rollouts if r.transcript.format_ok]
        scores = self.scorer([Item(q.text, r.transcript.final or "", q.answer) for q, r in scored])
        for (_, r), v in zip(scored, scores.values, strict=True):
            r.correct = v
        for message in scores.messages:
            self.event(message)
        return Scores([r.correct for _, r in rollouts], scores.rejected, scores.errors, scores.messages)

    def evaluate(self, rollout: Callable[[str, Question], Transcript]) -> dict[str, float]:
        """Greedy rollouts of the held-out questions with the current policy (`rollout(query id,
        question)`): success (the job's scorer) and format rate."""
        items = list(enumerate(self.held_out))
        with ThreadPoolExecutor(max_workers=min(64, len(items))) as pool:
            transcripts = list(pool.map(lambda it: rollout(f"eval{it[0]}", it[1]), items))
        scored = [(q, t) for q, t in zip(self.held_out, transcripts, strict=True) if t.format_ok]
        scores = self.scorer([Item(q.text, t.final or "", q.answer) for q, t in scored])
        success = list(scores.values) + [0.0] * (len(items) - len(scored))
        return {
            "success": finite_mean(success),
            "format_ok": float(np.mean([t.format_ok for t in transcripts])),
            "queries": float(len(items)),
            "reward_rejected": float(scores.rejected),
        }

    def evaluated(
        self, run: Callable[[], None], rollout: Callable[[str, Question], Transcript], fresh: bool
    ) -> None:
        """`run()` the job between held-out evaluations (before only on a `fresh` start), with the
        results as the job's `eval` metrics; just `run()` without a held-out split."""
        before = self.evaluate(rollout) if self.held_out and fresh else None
        run()
        if not self.held_out:
            return
        after = self.evaluate(rollout)
        values = {f"{k}_after": v for k, v in after.items()}
        if before is not None:
            values |= {f"{k}_before": v for k, v in before.items()}
            values["success_gain"] = after["success"] - before["success"]
        self.emit(MetricsEvent(job_id=self.job_id, step=self.cfg.steps - 1, role="eval", values=values))

    def close(self) -> None:
        self.scorer.close()
