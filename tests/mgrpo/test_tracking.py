"""Experiment trackers (`mgrpo.tracking`) with their real libraries, offline: what a trainer logs is
read back with TensorBoard's event reader, the MLflow client and the W&B offline run's file; a tracker that raises or hangs
never fails or holds up the job."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mgrpo.config import TRACKERS, JobConfig
from mgrpo.runtime import Placement
from mgrpo.tracking import _OPENERS, Trackers, flat_params, open_trackers
from tests.waiting import wait_for
from tests.wandb_files import finished, history, run_info, summary


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def logged(tmp_path, tracking, role, steps, start_step=0, job_id="job-1"):
    errors: list[str] = []
    cfg = JobConfig.model_validate({"tracking": tracking, "steps": 3})
    t = open_trackers(
        cfg,
        job_id,
        role,
        placement=Placement(tracking_dir=tmp_path),
        start_step=start_step,
        report=errors.append,
    )
    for step in steps:
        t.log(step, {f"{role}/reward_mean": step / 10, f"{role}/nan": float("nan"), f"{role}/gone": None})
    t.close(checkpoint=f"/ckpt/{job_id}/{role}/step-{max(steps):06d}")
    return errors


def images(folder) -> dict[str, list[tuple[int, int, int]]]:
    acc = EventAccumulator(str(folder), size_guidance={"images": 0})
    acc.Reload()
    return {tag: [(e.step, e.width, e.height) for e in acc.Images(tag)] for tag in acc.Tags()["images"]}


def texts(folder) -> dict[str, list[str]]:
    acc = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag.removesuffix("/text_summary"): [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
    }


def test_tensorboard_writes_each_role_as_a_run_of_the_job(tmp_path):
    assert logged(tmp_path, ["tensorboard"], "planner", range(3)) == [
        f"tracking: planner's metrics of 3 steps in tensorboard {tmp_path / 'tensorboard' / 'job-1' / 'planner'}"
    ]
    assert len(logged(tmp_path, ["tensorboard"], "subagent", range(3))) == 1
    for role in ("planner", "subagent"):
        got = scalars(tmp_path / "tensorboard" / "job-1" / role)
        # finite values only: a NaN or missing metric is left out, not plotted as 0
        assert got == {f"{role}/reward_mean": [(0, 0.0), (1, pytest.approx(0.1)), (2, pytest.approx(0.2))]}
        # at the job's end: the reward curve as an image and the final checkpoint's path, at the last step
        assert images(tmp_path / "tensorboard" / "job-1" / role) == {"reward_curve": [(2, 600, 350)]}
        assert texts(tmp_path / "tensorboard" / "job-1" / role)["checkpoint"] == [
            f"/ckpt/job-1/{role}/step-000002"
        ]


def test_a_resumed_job_replaces_the_steps_it_trains_again(tmp_path):
    logged(
        tmp_path, ["tensorboard"], "planner", range(3)
    )  # killed after step 2 was logged, before its ledger
    logged(tmp_path, ["tensorboard"], "planner", [2, 3], start_step=2)
    got = scalars(tmp_path / "tensorboard" / "job-1" / "planner")["planner/reward_mean"]
    assert [s for s, _ in got] == [0, 1, 2, 3]


def test_mlflow_one_run_per_role_tagged_with_the_job_and_continued_on_resume(tmp_path):
    for role, steps, start in (("planner", range(2), 0), ("subagent", range(3), 0), ("planner", [2], 2)):
        said = logged(tmp_path, ["mlflow"], role, steps, start_step=start)  # the last: the resumed planner
        assert said == [
            f"tracking: {role}'s metrics of {len(steps)} steps in mlflow sqlite:///{tmp_path / 'mlflow.db'} "
            f"(experiment mgrpo, run job-1/{role})"
        ]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("mgrpo").experiment_id
    runs = {r.data.tags["role"]: r for r in client.search_runs([exp], "tags.job_id = 'job-1'")}
    assert sorted(runs) == ["planner", "subagent"] and runs["planner"].info.run_name == "job-1/planner"
    for role, run in runs.items():
        history = client.get_metric_history(run.info.run_id, f"{role}/reward_mean")
        assert sorted(m.step for m in history) == [0, 1, 2]
        assert run.data.params["steps"] == "3" and run.info.status == "FINISHED"
        assert run.data.tags["checkpoint"] == f"/ckpt/job-1/{role}/step-000002"  # the last trainer's word
        assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["reward_curve.png"]
        where = client.download_artifacts(run.info.run_id, "reward_curve.png", str(tmp_path / role))
        assert Path(where).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "mlflow-artifacts").is_dir()  # beside the store, not ./mlruns of the trainer's folder


class Raising:
    def __init__(self):
        self.calls = 0

    def log(self, step, values):
        self.calls += 1
        raise ConnectionError("no route to the tracking server")

    def finish(self, curve, checkpoint):
        raise ConnectionError("no route to the tracking server")

    def close(self):
        raise ConnectionError("no route to the tracking server")


class Recording:
    where = "good"

    def __init__(self):
        self.steps, self.closed = [], False

    def log(self, step, values):
        self.steps.append(step)

    def finish(self, curve, checkpoint):
        self.finished = (curve, checkpoint)

    def close(self):
        self.closed = True


def test_a_tracker_that_raises_is_dropped_after_one_warning_and_the_others_go_on():
    bad, good, errors = Raising(), Recording(), []
    t = Trackers({"bad": lambda: bad, "good": lambda: good}, errors.append)
    for step in range(50):
        t.log(step, {"x": 1.0})
    t.close()
    assert bad.calls == 1 and good.steps == list(range(50)) and good.closed
    assert len(errors) == 2 and "tracker bad failed" in errors[0] and "training goes on" in errors[0]
    assert errors[1].startswith("tracking: ") and "good" in errors[1]


def test_a_tracker_that_cannot_open_warns_and_the_others_go_on():
    good, errors = Recording(), []

    def cannot_open():
        raise ImportError("No module named 'mlflow'")

    t = Trackers({"mlflow": cannot_open, "good": lambda: good}, errors.append)
    t.log(0, {"x": 1.0})
    t.close()
    assert good.steps == [0] and len(errors) == 2 and "ImportError" in errors[0]


def test_a_hanging_tracker_never_holds_up_the_job():
    """`log` returns at once even while a tracker hangs (its records wait in the bounded queue, the
    rest are dropped and counted), and the job's end waits for it at most the close timeout."""
    release = threading.Event()

    class Hanging(Recording):
        def log(self, step, values):
            release.wait()

    errors: list[str] = []
    t = Trackers({"hang": Hanging}, errors.append, queue_size=4)
    t0 = time.perf_counter()
    for step in range(100):
        t.log(step, {"x": 1.0})
    assert time.perf_counter() - t0 < 0.5
    t0 = time.perf_counter()
    t.close(timeout_s=0.2)
    assert time.perf_counter() - t0 < 1.0
    assert t.dropped >= 100 - 4 - 1
    release.set()


def test_a_tracking_uri_the_service_does_not_allow_is_refused_in_the_trainer_too(tmp_path):
    cfg = JobConfig.model_validate({"tracking": [{"name": "mlflow", "tracking_uri": "http://evil:5000"}]})
    errors: list[str] = []
    t = open_trackers(cfg, "j", "planner", placement=Placement(tracking_dir=tmp_path), report=errors.append)
    t.close()
    assert len(errors) == 1 and "not allowed here" in errors[0] and not (tmp_path / "mlflow.db").exists()


def test_job_config_as_flat_parameters():
    assert flat_params({"a": {"b": 1, "c": "x"}, "d": [1, 2], "e": None}) == {
        "a.b": "1",
        "a.c": "x",
        "d": "[1, 2]",
        "e": "null",
    }


def test_wandb_offline_one_run_per_role_grouped_by_the_job(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline unless the operator says online
    for role, steps in (("planner", range(3)), ("subagent", range(2))):
        (said,) = logged(tmp_path, ["wandb"], role, steps)
        assert (
            said.startswith(f"tracking: {role}'s metrics of {len(steps)} steps in wandb ")
            and "offline" in said
        )
    wait_for(lambda: finished(tmp_path / "wandb", 2), "W&B's writer wrote both runs to their end", 60)
    runs = {}
    for f in finished(tmp_path / "wandb", 2):
        info = run_info(f)
        runs[info.job_type] = (info, history(f), f)
    assert sorted(runs) == ["planner", "subagent"]
    for role, (info, metrics, f) in runs.items():
        assert (info.display_name, info.run_group, info.project) == (f"job-1/{role}", "job-1", "mgrpo")
        assert {u.key: u.value_json for u in info.config.update}["steps"] == "3"
        want = {s: pytest.approx(s / 10) for s in range(3 if role == "planner" else 2)}
        curve = {k: metrics.pop(k) for k in list(metrics) if k.startswith("reward_curve/")}  # the end's image
        assert metrics == {f"{role}/reward_mean": want}  # NaN and missing values left out
        assert curve["reward_curve/_type"] == {len(want) - 1: "image-file"}  # with the last step
        assert curve["reward_curve/format"] == {len(want) - 1: "png"}
        last = len(want) - 1
        assert summary(f)["checkpoint"] == f"/ckpt/job-1/{role}/step-{last:06d}"


def test_every_tracker_a_job_may_name_has_an_opener():
    assert set(TRACKERS) == set(_OPENERS)
