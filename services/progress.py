"""Progress of long work (warm starts, jobs, evaluations) in a terminal and in a log file: rich's live
bar on a terminal; plain `<title> <done>/<total> <elapsed> <rate> ETA <left> <info>` lines, at most one
every `every_s` seconds (`MGRPO_PROGRESS_EVERY_S`, default 10; and the last), when the output is not a
terminal (a pipe, a CI log, `> run.log`)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


@dataclass
class StepProgress:
    console: Console
    title: str
    total: int
    every_s: float = field(default_factory=lambda: float(os.environ.get("MGRPO_PROGRESS_EVERY_S", "10")))
    _bar: Progress | None = None
    _task: TaskID | None = None
    _t0: float = field(default_factory=time.monotonic)
    _last: float = -1e9
    _done: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def advance(self, info: str = "") -> None:
        """One more unit done; safe to call from worker threads."""
        with self._lock:
            self.update(self._done + 1, info)

    def update(self, done: int, info: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, info=info)
            self._done = max(self._done, done)
            return
        now = time.monotonic()
        if (done != self._done and now - self._last >= self.every_s) or (done >= self.total > self._done):
            self.console.print(
                f"{self.title} {done}/{self.total} {plain_timing(done, self.total, now - self._t0)} {info}",
                soft_wrap=True,
                highlight=False,
            )
            self._last = now
        self._done = max(self._done, done)


@contextmanager
def step_progress(console: Console, title: str, total: int, info: str = "") -> Iterator[StepProgress]:
    progress = StepProgress(console, title, total)
    if not console.is_terminal:
        yield progress
        return
    cols = (
        TextColumn(f"[bold]{title}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*cols, console=console) as bar:
        progress._bar, progress._task = bar, bar.add_task(title, total=total, info=info)
        yield progress


def plain_timing(done: int, total: int, elapsed_s: float) -> str:
    """`<elapsed> <rate> ETA <left>` for a plain progress line: `95s 0.79 s/it ETA 3m 12s`
    (`it/s` when faster than one a second); no rate before the first unit of work is done or when all
    was done within the first second (a cached result), no ETA once all is done. A fast first unit
    (under a second, as on a quicker machine) still gets its rate and ETA."""
    cached = done >= total and elapsed_s < 1.0
    if done <= 0 or elapsed_s <= 0.0 or cached:
        return f"{elapsed_s:.0f}s"
    per = elapsed_s / done
    rate = f"{per:.2f} s/it" if per >= 1.0 else f"{1 / per:.1f} it/s"
    if done >= total:
        return f"{elapsed_s:.0f}s {rate}"
    left = (total - done) * per
    return f"{elapsed_s:.0f}s {rate} ETA {int(left // 60)}m {int(left % 60):02d}s"


class Phases:
    """Displays of several kinds of work one after the other (`phases`): `start` closes the current
    display and opens the next; `advance_in` counts one unit in the named display, opening it first
    (from any thread); `update` goes to the current one."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.title = ""
        self._cm: AbstractContextManager[StepProgress] | None = None
        self._bar: StepProgress | None = None
        self._lock = threading.Lock()

    def start(self, title: str, total: int, info: str = "") -> None:
        self.close()
        self.title, self._cm = title, step_progress(self.console, title, total, info)
        self._bar = self._cm.__enter__()

    def update(self, done: int, info: str) -> None:
        if self._bar is not None:
            self._bar.update(done, info)

    def advance_in(self, title: str, total: int, info: str = "") -> None:
        with self._lock:
            if title != self.title:
                self.start(title, total)
            bar = self._bar
        if bar is not None:
            bar.advance(info)

    def close(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
        self._cm, self._bar = None, None


@contextmanager
def phases(console: Console) -> Iterator[Phases]:
    show = Phases(console)
    try:
        yield show
    finally:
        show.close()
