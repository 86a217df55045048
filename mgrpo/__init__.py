"""mgrpo core: the M-GRPO math, configuration, models, rollout engines, agents and tasks.

This package is a leaf: it imports none of `shared_store`, the trainers or the services.
Importing `mgrpo` itself is cheap (no torch); submodules import what they need. It pins torch's and
MKL's CPU code paths (`mgrpo.reproducibility`), so that it happens before torch's first operation.
"""

from mgrpo.reproducibility import pin_cpu_numerics

pin_cpu_numerics()

__version__ = "0.1.0"
