"""The world study's bookkeeping (`bench/learning.py --worlds`, `--plateau`, `--combine`; issue 43): the
arms and the held-out cells they are scored on, the plateau rule for a warm start's SFT budget, the
per-world and pooled paired comparisons of the arms' final held-out success, and the parts of a study
run at different times combined as if run at once. Pure bookkeeping over results; `learning.py` runs
the jobs and evaluations that produce them."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mgrpo.evaluation import mean_over_runs, paired_by_question, pooled

ARMS: dict[str, dict[str, Any]] = {
    "co_train": {"mode": "co_train"},
    "main_only": {"mode": "main_only"},
    "single_agent": {"mode": "single_agent"},
    "co_train_no_align": {"mode": "co_train", "alignment": "none"},
    "co_train_pipelined": {"mode": "co_train", "max_staleness": 1},  # issue 13
}
CELLS = ("heldout_stage2_T1", "heldout_stage2_T0")
COMPARISONS = (("co_train", "main_only"), ("co_train", "single_agent"), ("main_only", "single_agent"))


PLATEAU_LADDER = (350, 700, 1400, 2800)  # SFT steps tried in turn by --plateau (one run, saved at each)


def plateau(
    scores: Callable[[int], dict[str, float]], ladder: Sequence[int] = PLATEAU_LADDER
) -> dict[str, Any]:
    """The shortest warm start on `ladder` whose held-out success (`scores(steps)`: success per
    question id) the next one does not beat by 2 paired SE: the warm start trained to its plateau.
    Returns its steps and every rung's success and gain over the one before."""
    rungs: list[dict[str, Any]] = []
    previous = scores(ladder[0])
    rungs.append({"steps": ladder[0], "success": sum(previous.values()) / len(previous)})
    for steps in ladder[1:]:
        now = scores(steps)
        g = paired_by_question(previous, now)
        rungs.append({"steps": steps, "success": g.after, "gain": g.gain, "se": g.se})
        if g.gain < 2 * g.se:
            return {"steps": rungs[-2]["steps"], "rungs": rungs}
        previous = now
    return {"steps": ladder[-1], "rungs": rungs, "capped": True}


def compare_worlds(
    runs: list[dict[str, Any]], starts: dict[tuple[int, bool], dict[str, Any]]
) -> dict[str, Any]:
    """Per world and pooled: each arm's final held-out success (T = 1, mean over run seeds, and each
    seed's), its paired gain over its warm start, the paired differences of `COMPARISONS`, and what
    the sub-agent learned (fact found at start and end; training signal: share of flat samples)."""
    worlds = list(dict.fromkeys(r["world"] for r in runs))
    final: dict[int, dict[str, dict[str, float]]] = {}
    out: dict[str, Any] = {"worlds": {}, "pooled": {}}
    for w in worlds:
        mine = {a: [r for r in runs if r["world"] == w and r["arm"] == a] for a in ARMS}
        final[w] = {
            a: mean_over_runs([r["curve"][-1]["by_question"] for r in rs]) for a, rs in mine.items() if rs
        }
        row: dict[str, Any] = {"arms": {}, "differences": {}}
        for arm, rs in mine.items():
            if not rs:
                continue
            start = starts[(w, ARMS[arm]["mode"] == "single_agent")]
            gain = paired_by_question(start["by_question"], final[w][arm])
            row["arms"][arm] = {
                "seeds": [r["seed"] for r in rs],
                "start": gain.before,
                "final": gain.after,
                "final_per_seed": [r["curve"][-1][CELLS[0]]["success"] for r in rs],
                "gain": gain.gain,
                "gain_se": gain.se,
                "fact_found": [start[CELLS[0]].get("subagent_fact_found")]
                + [r["curve"][-1][CELLS[0]].get("subagent_fact_found") for r in rs],
                "flat_share": {k: _mean_of(rs, f"{k}/flat_share") for k in ("planner", "subagent")},
                "subagent_reward_first_last5": _first_last(rs, "subagent/reward_mean"),
                "planner_success_first_last5": _first_last(rs, "planner/success"),
            }
        for a, b in COMPARISONS:
            if a in final[w] and b in final[w]:
                d = paired_by_question(final[w][b], final[w][a])
                row["differences"][f"{a} - {b}"] = {"diff": d.gain, "se": d.se, "z": d.z}
        out["worlds"][str(w)] = row
    for a, b in COMPARISONS:
        per = {str(w): final[w] for w in worlds if a in final[w] and b in final[w]}
        if per:
            d = paired_by_question(
                pooled({w: f[b] for w, f in per.items()}), pooled({w: f[a] for w, f in per.items()})
            )
            out["pooled"][f"{a} - {b}"] = {"worlds": list(per), "diff": d.gain, "se": d.se, "z": d.z}
    out["pooled_gains"] = {}  # each arm's gain over its warm start, question by question within a world
    for arm in ARMS:
        per = {str(w): final[w][arm] for w in worlds if arm in final[w]}
        if per:
            single = ARMS[arm]["mode"] == "single_agent"
            before = pooled({w: starts[(int(w), single)]["by_question"] for w in per})
            d = paired_by_question(before, pooled(per))
            out["pooled_gains"][arm] = {"worlds": list(per), "diff": d.gain, "se": d.se, "z": d.z}
    return out


def combine(
    parts: Sequence[Path],
) -> tuple[list[dict[str, Any]], dict[tuple[int, bool], dict[str, Any]], dict]:
    """The runs, warm starts and plateaus of one study run in parts (`--combine`): each run once, and
    every run of a world from warm starts of the same SFT budget; a world's runs of one kind (pair or
    single agent) from one warm start (its own numbers on the questions, kept as each run's first point)."""
    runs: list[dict[str, Any]] = []
    starts: dict[tuple[int, bool], dict[str, Any]] = {}
    plateaus: dict[str, Any] = {}
    budget: dict[int, Any] = {}
    for part in parts:
        study = json.loads(part.read_text())
        plateaus |= study.get("plateaus", {})
        for r in study["runs"]:
            w, name = r["world"], f"{r['arm']} seed {r['seed']} of world {r['world']}"
            if any((x["world"], x["arm"], x["seed"]) == (w, r["arm"], r["seed"]) for x in runs):
                raise ValueError(f"{part}: {name} is in two of the parts: give each run once")
            steps = r["job"].get("warmstart_steps")
            if budget.setdefault(w, steps) != steps:
                raise ValueError(
                    f"{part}: {name} starts from {steps} SFT steps, other runs of world {w} from "
                    f"{budget[w]}: combine runs whose arms start from the same SFT budget"
                )
            key = (w, ARMS[r["arm"]]["mode"] == "single_agent")
            start = {k: v for k, v in r["curve"][0].items() if k != "updates"}
            if starts.setdefault(key, start)["by_question"] != start["by_question"]:
                raise ValueError(
                    f"{part}: {name} starts from another warm start than the other runs of its kind "
                    "on that world (other outcomes on the same questions): combine parts of one study"
                )
            runs.append(r)
    return runs, starts, plateaus


def _mean_of(runs: list[dict[str, Any]], key: str) -> float | None:
    xs = [x for r in runs for x in r.get("train", {}).get(key, []) if x is not None]
    return statistics.fmean(xs) if xs else None


def _first_last(runs: list[dict[str, Any]], key: str) -> list[float | None]:
    """Mean of a training series over the first five and the last five steps, pooled over runs."""
    series = [[x for x in r.get("train", {}).get(key, []) if x is not None] for r in runs]
    first = [x for s in series for x in s[:5]]
    last = [x for s in series for x in s[-5:]]
    return [statistics.fmean(first) if first else None, statistics.fmean(last) if last else None]


def write_world_table(study: dict[str, Any], path: Path) -> None:
    lines = [
        "| world | arm | seeds | held-out T=1: warm start → final (per seed) | gain ± paired SE | sub-agent finds the fact: start → per seed | flat samples: planner / sub-agent |",
        "|---|---|---|---|---|---|---|",
    ]
    for w, row in study["worlds"].items():
        for arm, a in row["arms"].items():
            seeds = ", ".join(f"{x:.3f}" for x in a["final_per_seed"])
            facts = a["fact_found"]
            fact = (
                "—" if facts[0] is None else f"{facts[0]:.2f} → " + ", ".join(f"{x:.2f}" for x in facts[1:])
            )
            flat = " / ".join("—" if v is None else f"{v:.2f}" for v in a["flat_share"].values())
            lines.append(
                f"| {w} | {arm} | {len(a['seeds'])} | {a['start']:.3f} → {a['final']:.3f} ({seeds}) "
                f"| {a['gain']:+.3f} ± {a['gain_se']:.3f} | {fact} | {flat} |"
            )
    lines += ["", "| comparison | " + " | ".join(f"world {w}" for w in study["worlds"]) + " | pooled |"]
    lines.append("|---" * (len(study["worlds"]) + 2) + "|")
    for name, p in study["pooled"].items():
        cells = []
        for row in study["worlds"].values():
            d = row["differences"].get(name)
            cells.append("—" if d is None else f"{d['diff']:+.3f} ± {d['se']:.3f} ({d['z']:.1f} SE)")
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {p['diff']:+.3f} ± {p['se']:.3f} ({p['z']:.1f} SE) |"
        )
    for arm, p in study.get("pooled_gains", {}).items():
        cells = []
        for row in study["worlds"].values():
            a = row["arms"].get(arm)
            cells.append("—" if a is None else f"{a['gain']:+.3f} ± {a['gain_se']:.3f}")
        lines.append(
            f"| {arm} − its warm start | "
            + " | ".join(cells)
            + f" | {p['diff']:+.3f} ± {p['se']:.3f} ({p['z']:.1f} SE) |"
        )
    path.write_text("\n".join(lines) + "\n")
