"""Progress lines (`services.progress`) as a log file shows them."""

import io

from rich.console import Console

from services.progress import plain_timing, step_progress


def test_plain_timing_gives_rate_and_eta():
    assert plain_timing(0, 10, 3.2) == "3s"
    assert plain_timing(4, 10, 8.0) == "8s 2.00 s/it ETA 0m 12s"
    assert plain_timing(50, 350, 25.0) == "25s 2.0 it/s ETA 2m 30s"
    assert plain_timing(10, 10, 6.0) == "6s 1.7 it/s"  # done: no ETA
    assert plain_timing(750, 750, 0.004) == "0s"  # a cached result: no rate
    assert plain_timing(1, 5, 0.4) == "0s 2.5 it/s ETA 0m 01s"  # a fast first step (a quicker machine)
    assert plain_timing(0, 5, 0.0) == "0s"


def test_plain_lines_when_not_a_terminal_and_thread_safe_advance():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    with step_progress(console, "evaluation", 3) as bar:
        for _ in range(3):
            bar.advance("rollouts")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("evaluation 1/3 ") and lines[-1].startswith("evaluation 3/3 ")
    assert lines[-1].endswith("rollouts")
