"""`mgrpo demo` run as a real process (python -m services.cli): the deep-research and MarsRL demos end
to end, and the number of questions each evaluates."""

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.services.checks import ROOT, mgrpo


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_end_to_end_with_embedded_redis(tmp_path):
    """The README's first command, one step: warm start (cached), embedded Redis, three service
    processes, a job over REST, held-out evaluation, files in the run folder; with `--tracking
    tensorboard`, each role's curves in the run's tracking folder."""
    cache = ROOT / ".cache" / "mgrpo"
    proc = mgrpo(
        "demo",
        "--steps",
        "1",
        "--eval-questions",
        "40",
        "--run-dir",
        "out",
        "--cache-dir",
        str(cache),
        "--tracking",
        "tensorboard",
        cwd=tmp_path,
        drop=("REDIS_URL",),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    board = out / "tracking" / "tensorboard"
    assert "tensorboard: tensorboard --logdir out/tracking/tensorboard" in proc.stdout
    (job,) = board.iterdir()  # one job, its roles side by side as runs
    for role in ("planner", "subagent"):
        acc = EventAccumulator(str(job / role))
        acc.Reload()
        assert [e.step for e in acc.Scalars(f"{role}/reward_mean")] == [0], role
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert (
        [r["step"] for r in rows] == [0]
        and "planner/reward_mean" in rows[0]
        and "subagent/reward_mean" in rows[0]
    )
    result = json.loads((out / "eval.json").read_text())
    assert set(result["after"]) == set(result["before"]) and "heldout_stage2_T1" in result["after"]
    per_question, gain = result["success_per_question"], result["gain"]
    assert len(per_question["before"]) == len(per_question["after"]) == 40 == gain["n"]
    assert gain["before"] == result["before"]["heldout_stage2_T1"]["success"]
    assert gain["after"] == result["after"]["heldout_stage2_T1"]["success"]
    assert "standard errors, paired" in " ".join(proc.stdout.split())
    assert "held-out evaluation, warm start then trained, 40 questions each 80/80" in proc.stdout
    assert (out / "rewards.png").stat().st_size > 10_000
    assert (out / "redis" / "appendonly.aof").exists() or (
        out / "redis" / "appendonlydir"
    ).exists()  # embedded
    assert "held-out" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    assert_phases(proc.stdout)


def assert_phases(stdout: str) -> None:
    """A demo names each phase as it starts and ends with its time, the warm start's own held-out
    results, and the total with each phase's share; a log gets whole lines (no path cut mid-way)."""
    for phase in ("warm start", "services", "job", "evaluation"):
        assert f"▶ {phase}" in stdout and f"✓ {phase} in " in stdout, phase
    assert any(
        f"{how}: " in stdout
        for how in ("shipped warm start", "warm start from the cache", "warm start built")
    )
    total = next(line for line in stdout.splitlines() if line.startswith("total "))
    assert all(p in total for p in ("warm start", "services", "job", "evaluation")), total
    wrote = next(line for line in stdout.splitlines() if line.startswith("wrote "))
    assert wrote.rstrip().endswith(("step-000000", "checkpoints")), wrote  # the whole path on one line


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_marsrl_demo_end_to_end(tmp_path):
    """`mgrpo demo --workflow marsrl`, one step, on the short warm start the MarsRL e2e tests share:
    the three role services, a marsrl job over REST, the V–C evaluation before/after with paired
    gains (per-problem outcomes in eval.json), files."""
    cache = ROOT / ".cache" / "mgrpo"
    proc = mgrpo(
        "demo",
        "--workflow",
        "marsrl",
        "--steps",
        "1",
        "--eval-questions",
        "20",
        "--warmstart-steps",
        "150",
        "--run-dir",
        "out",
        "--cache-dir",
        str(cache),
        cwd=tmp_path,
        drop=("REDIS_URL",),
        timeout=1100,
    )  # it builds the MarsRL warm start: ~600 s on busy cores
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"solver/reward_mean", "verifier/reward_mean", "corrector/reward_mean"} <= set(row)
    result = json.loads((out / "eval.json").read_text())
    for when in ("before", "after"):
        assert {"solver_accuracy", "system_accuracy", "verifier_precision", "verifier_recall"} <= set(
            result[when]
        )
    assert (
        set(result["checkpoints"]) == {"solver", "verifier", "corrector"}
        and 0 <= result["majority_baseline"] < 1
    )
    for name in ("solver_accuracy", "system_accuracy"):  # the gains are paired over the same 20 problems
        per_problem = {when: result["outcomes"][when][name] for when in ("before", "after")}
        assert all(len(v) == 20 and set(v) <= {0.0, 1.0} for v in per_problem.values())
        assert all(abs(sum(v) / 20 - result[when][name]) < 1e-9 for when, v in per_problem.items())
        gain = result["gains"][name]
        assert abs(gain["gain"] - (result["after"][name] - result["before"][name])) < 1e-9
        d = [a - b for a, b in zip(per_problem["after"], per_problem["before"], strict=True)]
        mean = sum(d) / 20
        assert abs(gain["paired_se"] - (sum((x - mean) ** 2 for x in d) / 19 / 20) ** 0.5) < 1e-9
    for when in ("before", "after"):  # what the loop adds over the solver alone, on the same problems
        loop = result["system_minus_solver"][when]
        assert abs(loop["gain"] - (result[when]["system_accuracy"] - result[when]["solver_accuracy"])) < 1e-9
    assert "V–C system − solver alone: before" in proc.stdout
    assert "standard errors, paired" in " ".join(proc.stdout.split())
    assert "system_accuracy" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    # not a terminal: plain progress lines a log file keeps (the warm start's, then the job's with each role)
    assert "MarsRL warm start 150/150" in proc.stdout
    job_lines = [line for line in proc.stdout.splitlines() if line.startswith("MarsRL job-")]
    job_line = next(
        (line for line in job_lines if "still working" not in line and " 1/1 " in line), job_lines
    )
    assert " 1/1 " in job_line and "solver" in job_line and "verifier" in job_line and "s/step" in job_line
    assert "held-out V–C evaluation, warm start then trained, 20 problems each 40/40" in proc.stdout
    assert_phases(proc.stdout)


def test_demo_evaluates_each_workflow_on_its_default_number_of_questions(monkeypatch, tmp_path):
    """Without --eval-questions the deep-research demo scores 1,600 held-out questions (its gain's
    paired SE near 0.011) and the MarsRL demo 400 problems; the option overrides both. The demos
    themselves are replaced by recorders here (the real ones run end to end above)."""
    from typer.testing import CliRunner

    import services.demo
    import services.demo_marsrl
    from services.cli import app

    seen: dict[str, int] = {}
    monkeypatch.setattr(
        services.demo,
        "run_demo",
        lambda out, options, console: seen.update(deep=services.demo.eval_count(options)),
    )
    monkeypatch.setattr(
        services.demo_marsrl,
        "run_marsrl_demo",
        lambda out, options, console: seen.update(marsrl=services.demo_marsrl.eval_count(options)),
    )
    runner = CliRunner()
    for args in ([], ["--workflow", "marsrl"]):
        result = runner.invoke(app, ["demo", "--run-dir", str(tmp_path), *args])
        assert result.exit_code == 0, result.output
    assert seen == {"deep": 1600, "marsrl": 400}
    for args in ([], ["--workflow", "marsrl"]):
        assert (
            runner.invoke(
                app, ["demo", "--run-dir", str(tmp_path), "--eval-questions", "50", *args]
            ).exit_code
            == 0
        )
    assert seen == {"deep": 50, "marsrl": 50}
