"""`bench/trace_overhead.py --accounting` (issue 40): the spans each service wrote per step, read from
hand-made trace files, and the CPU cost of a recorded span (every span written) against a no-op one."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from trace_overhead import span_costs, spans_per_step


def write(path: Path, service: str, n: int) -> None:
    record = {"name": "episode", "resource": {"attributes": {"service.name": service}}}
    with path.open("a") as f:
        f.write("".join(json.dumps(record) + "\n" for _ in range(n)))


def test_spans_per_step_counts_every_file_of_each_service(tmp_path):
    write(tmp_path / "planner-1.jsonl", "mgrpo-planner", 30)
    write(tmp_path / "subagent-2.jsonl", "mgrpo-subagent", 50)
    write(tmp_path / "subagent-3.jsonl", "mgrpo-subagent", 10)  # a second process of one service
    (tmp_path / "notes.txt").write_text("not a trace file\n")
    assert spans_per_step(tmp_path, steps=5) == {"mgrpo-planner": 6.0, "mgrpo-subagent": 12.0}


def test_a_recorded_span_costs_more_than_a_noop_one():
    costs = span_costs(n=2000)  # raises unless the exporter wrote every span
    assert costs["recorded_us"] > 2 * costs["noop_us"] > 0
