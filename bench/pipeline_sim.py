"""A discrete-event model of the step schedule on separate nodes, synchronous vs pipelined (issue 13).

    .venv/bin/python bench/pipeline_sim.py                      # from bench/results/pipeline/results.json
    .venv/bin/python bench/pipeline_sim.py --results path/to/results.json --steps 8

Every role has its own node (one core here, a GPU node in a cluster). A step is one rollout task and
one update task per role:
- the rollout of step s takes R seconds when nothing else runs and keeps role r's node busy a share
  u_r of that time (the root decodes, the callees serve their episodes, interleaved across the step's
  concurrent rollouts);
- role r's update of step s (advantages, PPO, checkpoint, commit) takes T_r seconds of a whole node.
Dependencies are the trainers' own: rollouts run one after another; the rollout of step s waits until
every role applied step s − 1 − S (S = max_staleness; S = 0 is synchronous); role r's update of step
s waits for the rollout of step s and its own update of step s − 1.
Nodes are shared fluidly: the tasks running on a node get max-min fair shares of it (a rollout asks
u_r, an update the whole node) and a rollout progresses at the pace of its most starved node. Time
advances from one task's end to the next.

The inputs come from a measured synchronous run (`bench/pipeline.py`, pinned): R = rollout + reward,
T_root = the rest of the root's step, T_callee = the callee's step, and u_r from each service's CPU
seconds per step minus its update work, over R. The model then predicts the synchronous period (a
check of the inputs) and the pipelined one, compared with the measured pipelined run, and predicts
2–8 roles at several update/rollout ratios: a root like the measured one and n − 1 callees that share
the measured callee's rollout work (each u_callee / (n − 1)), every role's update T = ratio × R.

Two ceilings follow from the schedule and show in the predictions: rollouts run one at a time, so the
period is at least R and the gain at most (R + T_max) / R; and no node can do more than its own work
per step, so the period is at least max_r (u_r·R + T_r).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EPS = 1e-9


@dataclass(frozen=True)
class Role:
    name: str
    rollout_share: float  # u_r: the share of the rollout's time it keeps this role's node busy
    update_s: float  # T_r


def fair_shares(demands: list[float], capacity: float = 1.0) -> list[float]:
    """Max-min fair allocation of `capacity` among tasks asking `demands` (water filling)."""
    alloc = [0.0] * len(demands)
    left, open_ = capacity, [i for i, d in enumerate(demands) if d > 0]
    while open_ and left > EPS:
        share = left / len(open_)
        done = [i for i in open_ if demands[i] - alloc[i] <= share + EPS]
        if not done:
            for i in open_:
                alloc[i] += share
            break
        for i in done:
            left -= demands[i] - alloc[i]
            alloc[i] = demands[i]
        open_ = [i for i in open_ if i not in done]
    return alloc


def simulate(roles: list[Role], rollout_s: float, staleness: int, steps: int) -> dict[str, float]:
    """Run `steps` steps; returns the mean period over steps 1.. (as `bench/pipeline.py` measures:
    from the root's first finished update to the last update of any role) and the root's waits."""
    tasks: dict[tuple[str, int], dict[str, float]] = {}  # (kind, step) → node → demand
    work: dict[tuple[str, int], float] = {}
    for s in range(steps):
        tasks[("rollout", s)] = {r.name: r.rollout_share for r in roles if r.rollout_share > 0}
        work[("rollout", s)] = rollout_s
        for r in roles:
            tasks[(r.name, s)] = {r.name: 1.0}
            work[(r.name, s)] = r.update_s

    def deps(t: tuple[str, int]) -> list[tuple[str, int]]:
        kind, s = t
        if kind == "rollout":
            bound = s - 1 - staleness
            return [("rollout", s - 1)] * (s > 0) + [(r.name, bound) for r in roles] * (bound >= 0)
        return [("rollout", s)] + [(kind, s - 1)] * (s > 0)

    now, done, running = 0.0, {}, set()  # done: task → end time
    started: dict[tuple[str, int], float] = {}
    while len(done) < len(tasks):
        for t in tasks:
            if t not in done and t not in running and all(d in done for d in deps(t)):
                running.add(t)
                started[t] = now
        rate = _rates({t: tasks[t] for t in running})
        dt = min(work[t] / rate[t] for t in running if rate[t] > EPS)
        now += dt
        for t in list(running):
            work[t] -= rate[t] * dt
            if work[t] <= 1e-7:
                running.discard(t)
                done[t] = now
    root = roles[0].name
    t0, t_end = done[(root, 0)], max(done.values())
    waits = [started[("rollout", s)] - done[("rollout", s - 1)] for s in range(1, steps)]
    return {"period_s": (t_end - t0) / (steps - 1), "rollout_gap_s": statistics.fmean(waits)}


def _rates(running: dict[tuple[str, int], dict[str, float]]) -> dict[tuple[str, int], float]:
    """Each running task's progress rate: its fair share of every node it needs over its demand
    there, at the pace of its most starved node."""
    rate = dict.fromkeys(running, 1.0)
    for n in {n for demand in running.values() for n in demand}:
        on = [t for t, demand in running.items() if n in demand]
        alloc = fair_shares([running[t][n] for t in on])
        for t, a in zip(on, alloc, strict=True):
            rate[t] = min(rate[t], a / running[t][n])
    return rate


def inputs(run: dict[str, Any], work: float = 1.0) -> tuple[list[Role], float]:
    """The model's inputs from a measured synchronous run of `bench/pipeline.py`; `work` scales the
    callee's rollout work (delegations per rollout of the run to predict over the measured run's)."""
    ph, steps = run["phases_s"], run["steps"] - 1
    rollout = ph["rollout"] + ph.get("reward", 0.0)
    root_update = sum(ph.get(k, 0.0) for k in ("adv", "update", "checkpoint", "exchange_redis"))
    callee_update = ph["subagent_step"]
    out = []
    for name, update in (("planner", root_update), ("subagent", callee_update)):
        cpu = run["cpu_s"][name] / steps  # CPU seconds per step
        share = (cpu - update) / rollout * (work if name != "planner" else 1.0)
        out.append(Role(name, min(max(share, 0.0), 1.0), update))
    return out, rollout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=Path("bench/results/pipeline/results.json"))
    ap.add_argument(
        "--steps", type=int, default=0, help="steps per simulated run (default: the measured runs')"
    )
    ap.add_argument(
        "--out", type=Path, default=None, help="write the predictions here (default: beside --results)"
    )
    args = ap.parse_args()
    runs = [r for r in json.loads(args.results.read_text())["runs"] if r["setting"] == "pinned"]
    if not runs:
        raise SystemExit(f"{args.results} has no pinned run; run bench/pipeline.py --settings pinned first")
    report: dict[str, Any] = {"checks": [], "predictions": []}
    syncs = [r for r in runs if r["arm"] == "sync"]
    piped = [r for r in runs if r["arm"] == "pipelined"]
    for sync, pipe in zip(syncs, piped, strict=False):
        roles, rollout = inputs(sync)
        steps = args.steps or sync["steps"]
        pred = {S: simulate(roles, rollout, S, steps)["period_s"] for S in (0, 1)}
        meas = {0: 1 / sync["steps_per_s"], 1: 1 / pipe["steps_per_s"]}
        # the planner's sampling sets how many episodes the callee serves: the same config is not quite
        # the same work; the second prediction scales the callee's rollout work to the pipelined run's
        work = pipe.get("delegations_per_rollout", 1.0) / sync.get("delegations_per_rollout", 1.0)
        roles_w, _ = inputs(sync, work)
        pred_w = simulate(roles_w, rollout, 1, steps)["period_s"]
        check = {
            "roles": [r.__dict__ for r in roles],
            "rollout_s": rollout,
            "predicted_period_s": pred,
            "measured_period_s": meas,
            "pipelined_error": pred[1] / meas[1] - 1,
            "sync_error": pred[0] / meas[0] - 1,
            "callee_work_ratio": work,
            "pipelined_same_work_prediction_s": pred_w,
            "pipelined_same_work_error": pred_w / meas[1] - 1,
        }
        report["checks"].append(check)
        print(
            f"inputs R={rollout:.2f}s "
            + ", ".join(f"{r.name}: u={r.rollout_share:.2f} T={r.update_s:.2f}s" for r in roles)
            + f"\n  sync      predicted {pred[0]:.2f}s measured {meas[0]:.2f}s ({100 * check['sync_error']:+.0f} %)"
            f"\n  pipelined predicted {pred[1]:.2f}s measured {meas[1]:.2f}s ({100 * check['pipelined_error']:+.0f} %)"
            f"\n  pipelined, callee work scaled ×{work:.2f} to the run's delegations: {pred_w:.2f}s "
            f"({100 * check['pipelined_same_work_error']:+.0f} %)"
        )
    roles, rollout = inputs(syncs[0])
    root, callee = roles
    print("\nseparate nodes: the measured root and n-1 callees sharing the measured callee's rollout work;")
    print("every role's update T = ratio × R; periods in seconds")
    print(f"{'roles':>5} {'T/R':>5} {'sync s/step':>12} {'pipelined':>10} {'speed-up':>9}")
    for ratio in (0.25, 0.5, 1.0, 2.0):
        for n in range(2, 9):
            scaled = [Role("root", root.rollout_share, ratio * rollout)] + [
                Role(f"callee{i}", callee.rollout_share / (n - 1), ratio * rollout) for i in range(1, n)
            ]
            sync_p = simulate(scaled, rollout, 0, 24)["period_s"]
            pipe_p = simulate(scaled, rollout, 1, 24)["period_s"]
            report["predictions"].append(
                {
                    "roles": n,
                    "update_over_rollout": ratio,
                    "sync_period_s": sync_p,
                    "pipelined_period_s": pipe_p,
                    "speedup": sync_p / pipe_p,
                }
            )
            print(f"{n:>5} {ratio:>5} {sync_p:>12.2f} {pipe_p:>10.2f} {sync_p / pipe_p:>8.2f}×")
    out = args.out or args.results.parent / "simulation.json"
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
