"""Progress of long work (warm starts, jobs) in a terminal and in a log file: rich's live bar on a
terminal; plain `<title> <done>/<total> <elapsed> <info>` lines, at most one every `every_s`
seconds (and the last), when the output is not a terminal (a pipe, a CI log, `> run.log`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


@dataclass
class StepProgress:
    console: Console
    title: str
    total: int
    every_s: float = 10.0
    _bar: Progress | None = None
    _task: TaskID | None = None
    _t0: float = field(default_factory=time.monotonic)
    _last: float = -1e9
    _done: int = 0

    def update(self, done: int, info: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, info=info)
            return
        now = time.monotonic()
        if (done != self._done and now - self._last >= self.every_s) or (done >= self.total > self._done):
            self.console.print(
                f"{self.title} {done}/{self.total} {now - self._t0:.0f}s {info}", soft_wrap=True
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
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*cols, console=console) as bar:
        progress._bar, progress._task = bar, bar.add_task(title, total=total, info=info)
        yield progress
