"""Tasks: environments, tools and rewards. The built-in task is `deep_research` (offline, seeded)."""
