"""Which of a role's checkpoints are kept on its volume: the newest `keep`, and with `keep_every_steps`
> 0 every one whose step count (step + 1) is a multiple of it. One rule for the trainer that deletes
the others (`mgrpo.checkpoint.save_checkpoint`) and the API that lists them (`GET
/v1/jobs/{id}/checkpoints`), so the list shows what is on disk."""

from __future__ import annotations

from collections.abc import Iterable


def retained(steps: Iterable[int], *, keep: int = 2, keep_every_steps: int = 0) -> set[int]:
    """The steps of `steps` whose checkpoints are kept."""
    ordered = sorted(set(steps))
    newest = set(ordered[-keep:]) if keep > 0 else set()
    every = {s for s in ordered if keep_every_steps and (s + 1) % keep_every_steps == 0}
    return newest | every
