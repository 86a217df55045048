"""The M-GRPO math as pure functions (no I/O, no Redis, no services).

Public API (stable; other packages and users rely on these names):

- `planner_reward`, `subagent_reward`               algorithm.md §2 (paper Eqs. 4-5)
- `group_advantages`                                algorithm.md §4 (paper Eqs. 9-13)
- `align_episodes`, `alignment_seed`                algorithm.md §3 (paper §4.1)
- `policy_loss`                                     algorithm.md §5
- `answer_reward`, `verifier_reward`, `select_inputs`   algorithm.md §9 (MarsRL)
"""

from mgrpo.algo.advantages import group_advantages
from mgrpo.algo.alignment import align_episodes, alignment_seed
from mgrpo.algo.loss import policy_loss
from mgrpo.algo.rewards import (
    answer_reward,
    normalize_answer,
    planner_reward,
    subagent_reward,
    verifier_reward,
)
from mgrpo.algo.selection import select_inputs

__all__ = [
    "align_episodes",
    "alignment_seed",
    "answer_reward",
    "group_advantages",
    "normalize_answer",
    "planner_reward",
    "policy_loss",
    "select_inputs",
    "subagent_reward",
    "verifier_reward",
]
