"""The planner trainer: rollouts with delegation to the sub-agent service, planner rewards,
per-query statistics to Redis, and the planner update (M-GRPO, SPEC §2-§7)."""
