"""Wait on an observable state, never on a sleep of a guessed length."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 120.0, every_s: float = 0.05) -> None:
    """Poll `check` until it holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(every_s)
