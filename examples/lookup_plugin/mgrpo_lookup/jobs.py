"""The plugin's root job: the deep-research planner's, on stage-1 (one-fact) questions."""

from __future__ import annotations

import random

from mgrpo.tasks.deep_research import Question, make_questions
from planner_trainer.job import PlannerJob
from planner_trainer.root import Rollouts


class LookupPlannerJob(PlannerJob):
    def questions(self, step: int) -> list[Question]:
        if self.queries.pool:  # a job's own dataset wins
            return super().questions(step)
        seed = random.Random(f"lookup:{self.cfg.seed}:{self.cfg.run_seed}:{step}").randrange(2**31)
        return make_questions(self.task.world, "train", 1, self.cfg.prompts_per_step, seed=seed)

    def produce(self, step: int) -> Rollouts:
        rollouts = super().produce(step)
        rollouts.values["lookup/one_fact_questions"] = float(self.cfg.prompts_per_step)
        return rollouts
