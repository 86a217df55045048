"""Agents that act: the format (tags and parsers), the multi-turn loop, the planner and the sub-agent."""
