"""The world study's bookkeeping (`bench/worlds.py`, behind `bench/learning.py --worlds`; issue 43) on
hand-made results: per world the arms are compared question by question (each question's success
averaged over the run seeds), and the pooled comparison pairs only within a world."""

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from worlds import CELLS, compare_worlds, write_world_table


def run(world, arm, seed, by_question):
    success = sum(by_question.values()) / len(by_question)
    return {
        "world": world,
        "arm": arm,
        "seed": seed,
        "curve": [{}, {CELLS[0]: {"success": success}, "by_question": by_question}],
        "train": {"subagent/flat_share": [0.5, 0.7]},
    }


def start(by_question):
    return {CELLS[0]: {"success": sum(by_question.values()) / len(by_question)}, "by_question": by_question}


def test_worlds_compare_arms_per_question_and_pool_within_worlds(tmp_path):
    runs = [
        run(1, "co_train", 0, {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0}),
        run(1, "co_train", 1, {"d": 1.0, "c": 1.0, "b": 1.0, "a": 0.0}),  # listed in another order
        run(1, "main_only", 0, {"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}),
        run(1, "main_only", 1, {"b": 0.0, "a": 1.0, "d": 0.0, "c": 0.0}),
        run(2, "co_train", 0, {"a": 1.0, "b": 1.0}),  # the same ids in another world: other questions
        run(2, "main_only", 0, {"a": 0.0, "b": 1.0}),
    ]
    starts = {
        (1, False): start({"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}),
        (2, False): start({"a": 0.0, "b": 0.0}),
    }
    study = compare_worlds(runs, starts)
    # world 1: co_train per question (.5, .5, 1, 1), main_only (.5, 0, .5, 0): d = (0, .5, .5, 1)
    w1 = study["worlds"]["1"]["differences"]["co_train - main_only"]
    assert w1["diff"] == pytest.approx(0.5) and w1["se"] == pytest.approx(math.sqrt(1 / 6) / 2)
    co1 = study["worlds"]["1"]["arms"]["co_train"]
    assert (co1["start"], co1["final"], co1["gain"]) == pytest.approx((0.25, 0.75, 0.5))
    assert co1["final_per_seed"] == [0.75, 0.75] and co1["flat_share"]["subagent"] == pytest.approx(0.6)
    # pooled: d = (0, .5, .5, 1) from world 1 and (1, 0) from world 2
    p = study["pooled"]["co_train - main_only"]
    assert p["worlds"] == ["1", "2"] and p["diff"] == pytest.approx(0.5)
    assert p["se"] == pytest.approx(math.sqrt(0.2 / 6))
    # co_train over its warm start, pooled: gains (.5, .5, 0, 1) in world 1 and (1, 1) in world 2
    g = study["pooled_gains"]["co_train"]
    assert g["worlds"] == ["1", "2"] and g["diff"] == pytest.approx(2 / 3)
    assert g["se"] == pytest.approx(math.sqrt(1 / 36))
    write_world_table(study, tmp_path / "worlds.md")
    table = (tmp_path / "worlds.md").read_text()
    assert (
        "| co_train - main_only | +0.500 ± 0.204 (2.4 SE) | +0.500 ± 0.500 (1.0 SE) | +0.500 ± 0.183 (2.7 SE) |"
        in table
    )
    assert (
        "| co_train − its warm start | +0.500 ± 0.204 | +1.000 ± 0.000 | +0.667 ± 0.167 (4.0 SE) |" in table
    )


def test_an_arm_scored_on_other_questions_is_refused():
    runs = [run(1, "co_train", 0, {"a": 1.0, "b": 0.0}), run(1, "main_only", 0, {"a": 1.0, "c": 0.0})]
    with pytest.raises(ValueError, match="same questions"):
        compare_worlds(runs, {(1, False): start({"a": 0.0, "b": 0.0})})


def test_the_plateau_is_the_last_warm_start_the_next_does_not_beat_by_two_paired_se():
    from worlds import plateau

    n = 400
    right = {f"q{i}": 1.0 for i in range(n)}

    def at(share: float) -> dict[str, float]:  # the first share·n questions right
        return {q: float(i < share * n) for i, q in enumerate(right)}

    seen: list[int] = []

    def scores(steps: int) -> dict[str, float]:
        seen.append(steps)
        return at({350: 0.20, 700: 0.30, 1400: 0.305, 2800: 0.40}[steps])

    found = plateau(scores)
    # 0.20 → 0.30: +0.10, far over 2 SE; 0.30 → 0.305: +0.005 with SE 0.0035, under 2 SE: stop at 700
    assert found["steps"] == 700 and seen == [350, 700, 1400]
    assert [r["steps"] for r in found["rungs"]] == [350, 700, 1400]
    assert found["rungs"][1]["gain"] == pytest.approx(0.10)
    rising = plateau(lambda steps: at(steps / 4000))  # never flattens on the ladder
    assert rising["steps"] == 2800 and rising.get("capped")


def part(tmp_path, name, runs, plateaus=None):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"runs": runs, "plateaus": plateaus or {}}))
    return path


def started(world, arm, seed, first, final, steps=700):
    """A run as `run_one` keeps it: its warm start's numbers as the curve's first point."""
    return run(world, arm, seed, final) | {
        "curve": [{"updates": 0, **start(first)}, run(world, arm, seed, final)["curve"][1]],
        "job": {"warmstart_steps": steps},
    }


def test_a_study_run_in_parts_is_compared_as_if_run_at_once(tmp_path):
    from worlds import combine

    pair, single = {"a": 0.0, "b": 1.0, "c": 0.0}, {"a": 0.0, "b": 0.0, "c": 0.0}
    first = [
        started(1, "co_train", 0, pair, {"a": 1.0, "b": 1.0, "c": 1.0}),
        started(1, "main_only", 0, pair, {"a": 0.0, "b": 1.0, "c": 1.0}),
    ]
    later = [started(1, "single_agent", 0, single, {"a": 0.0, "b": 1.0, "c": 0.0})]
    runs, starts, plateaus = combine(
        [part(tmp_path, "a", first, {"1": {"steps": 700}}), part(tmp_path, "b", later)]
    )
    assert plateaus == {"1": {"steps": 700}}
    at_once = compare_worlds(first + later, {(1, False): start(pair), (1, True): start(single)})
    assert compare_worlds(runs, starts) == at_once
    assert at_once["worlds"]["1"]["differences"]["co_train - single_agent"]["diff"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("later", "says"),
    [
        ([started(1, "co_train", 0, {"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0})], "in two of the parts"),
        (
            [started(1, "single_agent", 0, {"a": 0.0, "b": 0.0}, {"a": 0.0, "b": 1.0}, steps=350)],
            "same SFT budget",
        ),
        ([started(1, "main_only", 0, {"a": 1.0, "b": 1.0}, {"a": 0.0, "b": 1.0})], "another warm start"),
    ],
)
def test_parts_of_different_studies_are_refused(tmp_path, later, says):
    from worlds import combine

    first = [started(1, "co_train", 0, {"a": 0.0, "b": 1.0}, {"a": 1.0, "b": 1.0})]
    with pytest.raises(ValueError, match=says):
        combine([part(tmp_path, "a", first), part(tmp_path, "b", later)])
