"""The sub-agent trainer: serves delegated episodes with its current policy, records them in Redis,
and trains on the aligned, pooled sub-agent groups of each step (M-GRPO, algorithm.md §2–5)."""
