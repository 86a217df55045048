"""Progress lines (`services.progress`) as a log file shows them: a rate and an ETA only once known,
a heartbeat inside a long unit (driven by a fake clock, no sleeping), no line ever wrapped."""

import io

from rich.console import Console

from services.progress import PhaseClock, StepProgress, make_console, plain_timing, step_progress


def test_plain_timing_gives_rate_and_eta_once_they_are_known():
    assert plain_timing(0, 10, 3.2) == "3s"
    assert plain_timing(4, 10, 8.0) == "8s 2.00 s/it ETA 0m 12s"  # no first-unit time: over all of it
    assert plain_timing(50, 350, 25.0) == "25s 2.0 it/s ETA 2m 30s"
    assert plain_timing(10, 10, 6.0) == "6s 1.7 it/s"  # done: no ETA
    assert plain_timing(750, 750, 0.004) == "0s"  # a cached result: no rate
    # a slow first unit (models loading): no rate from it alone; later, the rate between units
    assert plain_timing(1, 20, 60.0, first_s=60.0) == "60s"
    assert plain_timing(3, 20, 70.0, first_s=60.0) == "70s 5.00 s/it ETA 1m 25s"  # not 23.3 s/it, 6m 36s


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_long_unit_still_writes_a_heartbeat_every_interval():
    """A non-terminal log hears from a unit that takes 35 s (a job's first step) at least every 10 s."""
    out, clock = io.StringIO(), Clock()
    bar = StepProgress(Console(file=out, force_terminal=False, width=80), "job", 5, every_s=10.0, clock=clock)
    bar.update(1, "step 0")
    for t in range(1, 36):  # the watcher thread's ticks, once a second
        clock.now = float(t)
        bar.tick()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("job 1/5 0s") and [line.split()[2] for line in lines] == [
        "0s",
        "10s",
        "20s",
        "30s",
    ]
    assert all("still working; step 0" in line for line in lines[1:])
    clock.now = 36.0
    bar.update(5, "done")
    assert out.getvalue().splitlines()[-1].startswith("job 5/5 36s")


def test_plain_lines_when_not_a_terminal_and_thread_safe_advance():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with step_progress(console, "evaluation", 3) as bar:
        for _ in range(3):
            bar.advance("rollouts")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("evaluation 1/3 ") and lines[-1].startswith("evaluation 3/3 ")
    assert lines[-1].endswith("rollouts")


def test_a_log_never_wraps_a_long_path_or_a_table():
    out = io.StringIO()
    console = make_console(out)
    path = "runs/demo-20261206-101010/checkpoints/" + "x" * 160 + "/planner/step-000019"
    assert len(path) > 200
    console.print(f"wrote {path}")
    from rich.table import Table

    table = Table("metric", "warm start", "after M-GRPO")
    table.add_row("subagent_first_search_right_entity" * 3, "0.578", "0.622")
    console.print(table)
    text = out.getvalue()
    assert f"wrote {path}\n" in text and "subagent_first_search_right_entity" * 3 in text


def test_the_phase_clock_names_each_phase_its_time_and_the_total():
    out, clock = io.StringIO(), Clock()
    phases = PhaseClock(Console(file=out, force_terminal=False, width=200), clock=clock)
    with phases.phase("warm start"):
        clock.now = 3.0
    with phases.phase("job"):
        clock.now = 125.0
    assert out.getvalue().splitlines() == [
        "▶ warm start",
        "✓ warm start in 3 s",
        "▶ job",
        "✓ job in 2 min 02 s",
    ]
    assert phases.total() == "total 2 min 05 s (warm start 3 s, job 2 min 02 s)"
