"""mgrpo core: the M-GRPO math, configuration, models, rollout engines, agents and tasks.

This package is a leaf: it imports none of `shared_store`, the trainers or the services.
Importing `mgrpo` itself is cheap (no torch); submodules import what they need.
"""

__version__ = "0.1.0"
