"""Progress of long work (warm starts, jobs, evaluations) in a terminal and in a log file.

On a terminal: rich's live bar. Elsewhere (a pipe, a CI log, `> run.log`): plain lines
`<title> <done>/<total> <elapsed> <rate> ETA <left> <info>`, one when a unit is done at most every
`every_s` seconds (`MGRPO_PROGRESS_EVERY_S`, default 10), the last one always, and a heartbeat line
(`… still working`) when `every_s` passed without one, even inside a long unit (a job's first step
while models load, a V–C evaluation's slow problems). A rate and an ETA appear only once they are
known: measured between finished units, so the start-up before the first does not inflate the ETA
(it once read 99 minutes for a 2-minute job). Lines are never wrapped (`make_console`).

`PhaseClock` names each phase of a command as it starts and ends, with its time, and the total.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import IO

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

LOG_WIDTH = 400  # columns of a non-terminal console: paths and tables are never wrapped mid-way


def make_console(file: IO[str] | None = None) -> Console:
    """A console for the CLI: a terminal's own width; a log or pipe never wrapped (soft wrap, wide)."""
    probe = Console(file=file or sys.stdout)
    return Console(file=file, soft_wrap=True, width=None if probe.is_terminal else LOG_WIDTH)


def every_s_default() -> float:
    return float(os.environ.get("MGRPO_PROGRESS_EVERY_S", "10"))


@dataclass
class StepProgress:
    console: Console
    title: str
    total: int
    every_s: float = field(default_factory=every_s_default)
    clock: Callable[[], float] = time.monotonic
    _bar: Progress | None = None
    _task: TaskID | None = None
    _t0: float = -1.0
    _t1: float | None = None  # when the first unit was done
    _last: float = -1e9  # when the last plain line was written
    _done: int = 0
    _info: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self._t0 < 0:
            self._t0 = self.clock()

    def advance(self, info: str = "") -> None:
        """One more unit done; safe to call from worker threads."""
        with self._lock:
            self.update(self._done + 1, info)

    def update(self, done: int, info: str) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, info=info)
            self._done = max(self._done, done)
            return
        now = self.clock()
        if done > 0 and self._t1 is None:
            self._t1 = now
        finished = done >= self.total > self._done
        if (done != self._done and now - self._last >= self.every_s) or finished:
            self._line(now, done, info)
        self._done, self._info = max(self._done, done), info

    def tick(self) -> None:
        """A heartbeat: a line when `every_s` passed without one (the watcher thread calls this)."""
        with self._lock:
            now = self.clock()
            if self._bar is None and self._done < self.total and now - self._last >= self.every_s:
                self._line(now, self._done, "still working" + (f"; {self._info}" if self._info else ""))

    def _line(self, now: float, done: int, info: str) -> None:
        first = None if self._t1 is None else self._t1 - self._t0
        timing = plain_timing(done, self.total, now - self._t0, first)
        self.console.print(f"{self.title} {done}/{self.total} {timing} {info}".rstrip(), highlight=False)
        self._last = now


@contextmanager
def step_progress(console: Console, title: str, total: int, info: str = "") -> Iterator[StepProgress]:
    progress = StepProgress(console, title, total)
    if not console.is_terminal:
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(1.0):
                progress.tick()

        watcher = threading.Thread(target=beat, name=f"progress-{title}", daemon=True)
        watcher.start()
        try:
            yield progress
        finally:
            stop.set()
            watcher.join(timeout=5)
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


def plain_timing(done: int, total: int, elapsed_s: float, first_s: float | None = None) -> str:
    """`<elapsed> <rate> ETA <left>` for a plain progress line: `95s 0.79 s/it ETA 3m 12s` (`it/s`
    when faster than one a second). The rate is measured from the first finished unit on
    (`first_s`: the time it took), so it is known from the second unit; with no `first_s`, over the
    whole elapsed time. No rate before it is known or when all was done within a second (a cached
    result); no ETA once all is done."""
    cached = done >= total and elapsed_s < 1.0
    if done <= 0 or elapsed_s <= 0.0 or cached:
        return f"{elapsed_s:.0f}s"
    if first_s is None:
        per = elapsed_s / done
    elif done >= 2 and elapsed_s > first_s:
        per = (elapsed_s - first_s) / (done - 1)
    else:
        return f"{elapsed_s:.0f}s"
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


def duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


class PhaseClock:
    """A command's phases, each announced as it starts and ends with its time (`phase`), and the total
    with each phase's share (`total`)."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.clock = console, clock
        self.t0 = clock()
        self.times: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.console.print(f"[bold]▶ {name}[/]")
        t0 = self.clock()
        try:
            yield
        finally:
            self.times[name] = self.clock() - t0
            self.console.print(f"[bold]✓ {name}[/] in {duration(self.times[name])}")

    def total(self) -> str:
        parts = ", ".join(f"{name} {duration(s)}" for name, s in self.times.items())
        return f"total {duration(self.clock() - self.t0)} ({parts})"
