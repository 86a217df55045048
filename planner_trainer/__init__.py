"""The planner trainer: rollouts with delegation to the sub-agent service, planner rewards,
per-query statistics to Redis, and the planner update (M-GRPO, algorithm.md §1–6)."""
