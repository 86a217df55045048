"""Experiment trackers (job `tracking`, cluster default `MGRPO_TRACKING`): every trainer service logs
its own role's per-step metrics to the trackers its job names, tied together by the job's id; there
is no central collector.

- `tensorboard`: event files in `<tracking dir>/<log_dir>/<job id>/<role>` (`log_dir` defaults to
  `tensorboard`), so `tensorboard --logdir <tracking dir>/tensorboard` shows every job's roles side by
  side as runs; the job's config as text. A resumed job purges the steps it trains again.
- `mlflow`: one run per role named `<job id>/<role>` and tagged `job_id` and `role`, in the
  experiment `experiment` (default `mgrpo`) of `tracking_uri` (default an SQLite store,
  `<tracking dir>/mlflow.db`); the job's config as parameters. A resumed job continues its runs.
- `wandb`: one run per role named `<job id>/<role>` in the group `<job id>` of project `project`,
  the job's config as the run's config; offline in `<tracking dir>/wandb` (`wandb sync` uploads it)
  unless the trainer's operator set `WANDB_MODE=online` and a key: a job cannot send data elsewhere.

When the job ends each role's trackers also get its final checkpoint's path (TensorBoard text, an
MLflow tag, the W&B run's summary) and its reward curve (`<role>/reward_mean` per step, drawn as a PNG:
a TensorBoard image, an MLflow artifact — kept under `<tracking dir>/mlflow-artifacts` with the default
store —, a W&B image).

A tracker never fails or slows the job: the calls run on a thread of their own behind a bounded
queue; a tracker that raises is dropped after one warning (`report`), and what does not fit the
queue is dropped and counted. When the role's trainer closes them, one event says where its records
went (`tracking: planner's metrics of 20 steps in …`), the sign they are all written.
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import math
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mgrpo.config import JobConfig, TrackerConfig
from mgrpo.runtime import Placement

log = logging.getLogger("mgrpo.tracking")
QUEUE_SIZE = 10_000  # metric records waiting for the trackers; more are dropped (and counted)
CLOSE_TIMEOUT_S = 10.0  # how long the job's end waits for the trackers to write what they hold


class Tracker(Protocol):
    where: str  # where its records go, for people

    def log(self, step: int, values: Mapping[str, float]) -> None: ...
    def finish(self, curve: Path | None, checkpoint: str | None) -> None: ...
    def close(self) -> None: ...


def finite(values: Mapping[str, float | None]) -> dict[str, float]:
    """The values a tracker can plot: numbers that are finite (a missing or NaN metric is left out)."""
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


def flat_params(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested job config as `a.b.c` → value strings (lists as JSON), the way trackers take parameters."""
    out: dict[str, str] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out |= flat_params(v, f"{key}.")
        else:
            out[key] = v if isinstance(v, str) else json.dumps(v)
    return out


class TensorBoardTracker:
    def __init__(self, folder: Path, config: Mapping[str, Any], start_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # the `tracking` extra (tensorboard)

        folder.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(str(folder), purge_step=start_step or None)
        self.where = f"tensorboard {folder}"
        self.last_step = start_step
        if start_step == 0:
            self.writer.add_text("job/config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.last_step = max(self.last_step, step)
        self.writer.flush()

    def finish(self, curve: Path | None, checkpoint: str | None) -> None:
        if curve is not None:
            from matplotlib.image import imread  # a dependency; only at the job's end

            self.writer.add_image("reward_curve", imread(curve)[..., :3], self.last_step, dataformats="HWC")
        if checkpoint is not None:
            self.writer.add_text("checkpoint", checkpoint, self.last_step)

    def close(self) -> None:
        self.writer.close()


class MlflowTracker:
    def __init__(
        self,
        uri: str,
        experiment: str,
        job_id: str,
        role: str,
        config: Mapping[str, Any],
        lock: Path,
        artifacts: Path | None = None,
    ) -> None:
        """`artifacts`: where a new experiment keeps its runs' files (None: the tracking server's
        choice; MLflow's own default is `./mlruns` of whatever folder the trainer runs in)."""
        from mlflow import MlflowClient  # the `tracking` extra (mlflow-skinny, sqlalchemy, alembic)
        from mlflow.entities import Param  # the `tracking` extra

        with _file_lock(lock):  # the roles' services share one store: one creates the experiment
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            exp = (
                found.experiment_id
                if found
                else self.client.create_experiment(
                    experiment, artifact_location=None if artifacts is None else artifacts.resolve().as_uri()
                )
            )
        self.where = f"mlflow {uri} (experiment {experiment}, run {job_id}/{role})"
        runs = self.client.search_runs(
            [exp], f"tags.job_id = '{job_id}' and tags.role = '{role}'", max_results=1
        )
        if runs:  # a resumed job: its run goes on
            self.run_id = runs[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
            return
        run = self.client.create_run(exp, run_name=f"{job_id}/{role}", tags={"job_id": job_id, "role": role})
        self.run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in flat_params(config).items()]
        for i in range(0, len(params), 100):  # the store takes at most 100 parameters a call
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric  # the `tracking` extra

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def finish(self, curve: Path | None, checkpoint: str | None) -> None:
        if curve is not None:
            self.client.log_artifact(self.run_id, str(curve))
        if checkpoint is not None:
            self.client.set_tag(self.run_id, "checkpoint", checkpoint)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbTracker:
    def __init__(self, folder: Path, project: str, job_id: str, role: str, config: Mapping[str, Any]) -> None:
        import wandb  # the `tracking` extra

        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            dir=folder,
            project=project,
            group=job_id,  # W&B shows a group's runs side by side: the job's roles
            name=f"{job_id}/{role}",
            job_type=role,
            id=f"{job_id}-{role}",  # a resumed job goes on in the same run when synced
            resume="allow",
            config=dict(config),
            mode=None if os.environ.get("WANDB_MODE") == "online" else "offline",
            reinit="create_new",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self.where = f"wandb {self.run.dir} (project {project}, group {job_id}, {self.run.settings.mode})"

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def finish(self, curve: Path | None, checkpoint: str | None) -> None:
        import wandb  # the `tracking` extra

        if curve is not None:
            self.run.log({"reward_curve": wandb.Image(str(curve))})
        if checkpoint is not None:
            self.run.summary["checkpoint"] = checkpoint

    def close(self) -> None:
        self.run.finish()


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def open_tracker(
    spec: TrackerConfig,
    tracking_dir: Path,
    job_id: str,
    role: str,
    config: Mapping[str, Any],
    start_step: int,
) -> Tracker:
    """One tracker of a job's `tracking` list for this role (module docstring)."""
    return _OPENERS[spec.name](spec, tracking_dir, job_id, role, config, start_step)


_OPENERS: dict[str, Callable[[TrackerConfig, Path, str, str, Mapping[str, Any], int], Tracker]] = {
    "tensorboard": lambda spec, where, job_id, role, config, start: TensorBoardTracker(
        where / (spec.log_dir or "tensorboard") / job_id / role, config, start
    ),
    "mlflow": lambda spec, where, job_id, role, config, start: MlflowTracker(
        spec.tracking_uri or f"sqlite:///{(where / 'mlflow.db').resolve()}",
        spec.experiment,
        job_id,
        role,
        config,
        where / "mlflow.lock",
        None if spec.tracking_uri else where / "mlflow-artifacts",
    ),
    "wandb": lambda spec, where, job_id, role, config, start: WandbTracker(
        where / "wandb", spec.project, job_id, role, config
    ),
}


class Trackers:
    """A role's trackers for one job, fed from a bounded queue by a thread of their own (module
    docstring). `log` never blocks and never raises; `close` waits at most `CLOSE_TIMEOUT_S`."""

    def __init__(
        self,
        opens: Mapping[str, Callable[[], Tracker]],
        report: Callable[[str], None],
        *,
        role: str = "",
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.report, self.role = report, role
        self.dropped = 0
        self._queue: queue.Queue[tuple[int, dict[str, float]] | _End] = queue.Queue(queue_size)
        self._opens = dict(opens)
        self._thread = threading.Thread(target=self._run, name="trackers", daemon=True)
        if self._opens:
            self._thread.start()

    def log(self, step: int, values: Mapping[str, float | None]) -> None:
        if not self._opens:
            return
        try:
            self._queue.put_nowait((step, finite(values)))
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S, *, checkpoint: str | None = None) -> None:
        """Hand the trackers the job's end (its final `checkpoint`'s path) and wait for them."""
        if not self._opens:
            return
        try:
            self._queue.put(_End(checkpoint), timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        live: dict[str, Tracker] = {}
        for name, open_ in self._opens.items():
            if (tracker := self._call(name, live, open_)) is not None:
                live[name] = tracker
        steps: set[int] = set()
        curve: dict[int, float] = {}
        while not isinstance(item := self._queue.get(), _End):
            steps.add(item[0])
            if (reward := item[1].get(f"{self.role}/reward_mean")) is not None:
                curve[item[0]] = reward
            for name, tracker in list(live.items()):
                self._call(name, live, tracker.log, *item)
        with tempfile.TemporaryDirectory() as tmp:
            png = reward_curve(curve, self.role, Path(tmp) / "reward_curve.png") if curve and live else None
            for name, tracker in list(live.items()):
                self._call(name, live, tracker.finish, png, item.checkpoint)
        for name, tracker in list(live.items()):
            self._call(name, live, tracker.close)
        if self.dropped:
            self.report(
                f"tracking: {self.dropped} metric records did not fit the trackers' queue and were dropped"
            )
        if live:
            where = "; ".join(t.where for t in live.values())
            self.report(f"tracking: {self.role}'s metrics of {len(steps)} steps in {where}")

    def _call(self, name: str, live: dict[str, Tracker], fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:  # a tracker never fails the job: it is dropped after one warning
            live.pop(name, None)
            log.warning("tracker %s failed: %s", name, exc, exc_info=True)
            self.report(
                f"tracker {name} failed and is off for the rest of this job ({type(exc).__name__}: "
                f"{str(exc)[:300]}); training goes on"
            )
            return None


@dataclass(frozen=True)
class _End:
    """The job's end in the trackers' queue."""

    checkpoint: str | None


def reward_curve(curve: Mapping[int, float], role: str, out: Path) -> Path:
    """The role's mean training reward per step as a PNG (the trackers' picture of the job)."""
    import matplotlib  # a dependency; only at the job's end

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after choosing the file backend

    steps = sorted(curve)
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot(steps, [curve[s] for s in steps], marker="o", markersize=3)
    ax.set(xlabel="step", ylabel="mean training reward", title=f"{role}: reward per step")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def open_trackers(
    cfg: JobConfig,
    job_id: str,
    role: str,
    *,
    placement: Placement,
    start_step: int = 0,
    report: Callable[[str], None],
) -> Trackers:
    """The trackers a job names (`cfg.tracking`; when it names none, the service's default,
    `placement.tracking`) for one role's trainer, writing under `placement.tracking_dir`. A tracking
    URI the service does not allow is refused here too (the controller refuses it at submission)."""
    specs = (
        cfg.tracking
        if cfg.tracking is not None
        else [TrackerConfig.model_validate({"name": n}) for n in placement.tracking]
    )
    config = cfg.model_dump(mode="json")
    opens: dict[str, Callable[[], Tracker]] = {}
    for s in specs:
        if s.tracking_uri is not None and s.tracking_uri not in placement.allowed_tracking_uris:
            report(
                f"tracker {s.name}: tracking_uri {s.tracking_uri!r} is not allowed here (MGRPO_ALLOWED_TRACKING_URIS); it is off"
            )
            continue
        opens[s.name] = functools.partial(
            open_tracker, s, placement.tracking_dir, job_id, role, config, start_step
        )
    return Trackers(opens, report, role=role)
