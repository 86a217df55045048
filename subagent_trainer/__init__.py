"""subagent_trainer."""
