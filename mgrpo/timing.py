"""The phase timer every trainer's step uses: the same phase names for every role (`wait_partner`,
`rollout`, `align`, `reward`, `adv`, `update`, `checkpoint`, `exchange_redis`), reported as
`timing/<phase>` for the root role and `timing/<role>_<phase>` for a callee role (one step's metrics
of all roles share one row of `metrics.jsonl`). Each phase is also a span of the step's trace
(`mgrpo.tracing`, when tracing is on), `step/<phase>`, with the timer's attributes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mgrpo import tracing


class PhaseTimer:
    def __init__(self, prefix: str = "timing/", **attrs: Any) -> None:
        """`attrs`: the phase spans' attributes (`job_id`, `step`, `role`)."""
        self.prefix, self.attrs = prefix, attrs
        self.seconds: dict[str, float] = {}
        self.t0 = time.perf_counter()

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            with tracing.span(f"step/{phase}", **self.attrs):
                yield
        finally:
            self.add(phase, time.perf_counter() - t)

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def values(self) -> dict[str, float]:
        """Every phase's seconds, and `step`: the whole step so far."""
        out = {f"{self.prefix}{k}": v for k, v in self.seconds.items()}
        out[f"{self.prefix}step"] = time.perf_counter() - self.t0
        return out
