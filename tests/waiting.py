"""Wait on an observable state, never on a sleep of a guessed length."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 120.0, every_s: float = 0.05) -> float:
    """Poll `check` until it holds and return the seconds that took; fail naming `what` after
    `timeout_s`."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() < t0 + timeout_s, f"never: {what}"
        time.sleep(every_s)
    return time.monotonic() - t0
