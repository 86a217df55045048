"""planner_trainer."""
