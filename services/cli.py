"""The `mgrpo` command line (typer). It launches things, so it sits on the top floor: nothing imports it."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mgrpo import __version__

if TYPE_CHECKING:
    from shared_store import Store

app = typer.Typer(
    name="mgrpo",
    help="Decoupled multi-server M-GRPO training for multi-agent LLM systems.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()


def fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code=2)


@contextlib.contextmanager
def redis_url_or_embedded(url: str | None, run_dir: Path) -> Iterator[str]:
    """Yield `url` (or REDIS_URL); with neither, start an embedded redis-server for the duration."""
    from shared_store.embedded import RedisServer

    chosen = url or os.environ.get("REDIS_URL")
    if chosen:
        yield chosen
        return
    server = RedisServer(run_dir / "redis")
    server.start()
    console.print(f"[dim]embedded Redis on {server.url} (set REDIS_URL to use your own)[/]")
    try:
        yield server.url
    finally:
        server.stop()


@app.command()
def serve(
    role: Annotated[str, typer.Argument(help="controller, planner or subagent")],
    host: Annotated[str, typer.Option(help="Bind address.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port.")] = 8000,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Run one service with uvicorn (settings from MGRPO_* and REDIS_URL environment variables)."""
    import uvicorn

    apps = {
        "controller": "services.controller:app",
        "planner": "services.planner:app",
        "subagent": "services.subagent:app",
    }
    if role not in apps:
        raise fail(f"unknown role {role!r}: choose one of {', '.join(apps)}")
    uvicorn.run(apps[role], host=host, port=port, log_level=log_level)


local_app = typer.Typer(help="A local cluster: embedded Redis + the three services as separate processes.")
app.add_typer(local_app, name="local")


@local_app.command("up")
def local_up(
    run_dir: Annotated[Path, typer.Option(help="Logs, checkpoints and the embedded Redis go here.")] = Path(
        "runs/local"
    ),
    redis_url: Annotated[
        str | None, typer.Option(envvar="REDIS_URL", help="Use this Redis instead of an embedded one.")
    ] = None,
    api_token: Annotated[
        str, typer.Option(envvar="MGRPO_API_TOKEN", help="Bearer token of the services.")
    ] = "",
    port: Annotated[
        int, typer.Option(help="Controller port; planner and sub-agent take the next two.")
    ] = 8000,
) -> None:
    """Start the cluster in the foreground (Ctrl-C stops it)."""
    from services.launcher import LocalCluster

    cluster = LocalCluster(run_dir, redis_url=redis_url, api_token=api_token,
                           ports={"controller": port, "planner": port + 1, "subagent": port + 2})  # fmt: skip
    try:
        cluster.start()
    except RuntimeError as exc:
        cluster.stop()
        raise fail(str(exc)) from None
    console.print(f"controller {cluster.url('controller')}  planner {cluster.url('planner')}  "
                  f"sub-agent {cluster.url('subagent')}  Redis {cluster.redis_url}  logs {run_dir}/logs")  # fmt: skip
    try:
        while all(p.poll() is None for p in cluster.procs.values()):
            time.sleep(1)
        raise fail(f"a service exited; see {run_dir}/logs")
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


def _client(url: str, token: str) -> Any:
    import httpx

    return httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30
    )


def _read_config(path: Path) -> dict[str, Any]:
    import yaml

    if not path.exists():
        raise fail(f"no config file at {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise fail(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise fail(f"{path} must hold a mapping of job config fields")
    return data


ControllerOpt = Annotated[str, typer.Option(envvar="MGRPO_CONTROLLER_URL", help="Controller URL.")]
TokenOpt = Annotated[str, typer.Option(envvar="MGRPO_API_TOKEN", help="Bearer token.")]


@app.command()
def submit(
    config: Annotated[Path, typer.Argument(help="Job config (YAML or JSON).")],
    controller: ControllerOpt = "http://127.0.0.1:8000",
    api_token: TokenOpt = "",
    job_id: Annotated[str | None, typer.Option(help="Idempotency: the same id returns the same job.")] = None,
) -> None:
    """Submit a job to a running controller (like `kubectl apply -f`)."""
    import httpx

    body = _read_config(config)
    try:
        with _client(controller, api_token) as http:
            resp = http.post("/v1/jobs", json=body, params={"job_id": job_id} if job_id else None)
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the controller at {controller}: {exc}") from None
    if resp.status_code != 201:
        raise fail(f"the controller refused the job ({resp.status_code}): {resp.text}")
    console.print(f"job [bold]{resp.json()['job_id']}[/] {resp.json()['status']}")


@app.command()
def status(
    job_id: Annotated[str | None, typer.Argument(help="A job id; all jobs when omitted.")] = None,
    controller: ControllerOpt = "http://127.0.0.1:8000",
) -> None:
    """Show jobs (like `kubectl get`)."""
    import httpx
    from rich.table import Table

    try:
        with _client(controller, "") as http:
            resp = http.get(f"/v1/jobs/{job_id}" if job_id else "/v1/jobs")
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the controller at {controller}: {exc}") from None
    if resp.status_code != 200:
        raise fail(f"{resp.status_code}: {resp.json().get('detail', resp.text)}")
    jobs = [resp.json()] if job_id else resp.json()["jobs"]
    table = Table("JOB", "STATUS", "MODE", "STEPS (planner/sub-agent)", "REASON")
    for j in jobs:
        done = j["steps_done"]
        steps = f"{done.get('planner', -1) + 1}/{done.get('subagent', -1) + 1} of {j['config'].get('steps')}"
        table.add_row(j["job_id"], j["status"], j["config"].get("mode", ""), steps, j["reason"][:60])
    console.print(table)


@app.command()
def version() -> None:
    """Print the mgrpo version."""
    console.print(__version__)


@app.command()
def warmstart(
    steps: Annotated[
        int | None, typer.Option(min=1, help="SFT steps (default: the documented early stop).")
    ] = None,
    n_people: Annotated[int | None, typer.Option(min=10, help="People in the generated world.")] = None,
    seed: Annotated[int, typer.Option(help="World and training seed.")] = 0,
    cache_dir: Annotated[Path, typer.Option(help="Where warm starts are cached.")] = Path(".cache/mgrpo"),
    single_agent: Annotated[bool, typer.Option(help="Warm-start the single-agent baseline instead.")] = False,
) -> None:
    """Warm-start (SFT) the tiny planner and sub-agent on demonstrations; cached and reused."""
    from mgrpo.warmstart import WarmstartConfig, cached_warmstart

    default = WarmstartConfig()
    cfg = WarmstartConfig(seed=seed, steps=steps or default.steps, n_people=n_people or default.n_people)
    cols = (TextColumn("[bold]warm start"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"))  # fmt: skip
    with Progress(*cols, console=console) as bar:
        task = bar.add_task("sft", total=cfg.steps, info="")

        def on_step(step: int, m: dict[str, float]) -> None:
            info = "  ".join(f"{k.replace('/sft_loss', '')} loss {v:.3f}" for k, v in m.items())
            bar.update(
                task, completed=step + 1, info=info if step + 1 < cfg.steps else "evaluating held-out …"
            )

        result = cached_warmstart(cfg, cache_dir, single_agent=single_agent, on_step=on_step)
        bar.update(task, completed=cfg.steps, info="done")
    console.print(f"{'cached' if result.cached else 'trained'}: {result.folder}")
    for name, m in result.metrics.items():
        process = "  ".join(f"{k} {v:.2f}" for k, v in m.items() if k not in ("success", "majority_baseline"))
        console.print(
            f"[bold]{name}[/] success {m['success']:.2f}  majority baseline {m['majority_baseline']:.2f}"
        )
        console.print(f"  [dim]{process}[/]")


@app.command()
def demo(
    steps: Annotated[int, typer.Option(min=1, max=10_000, help="Training steps.")] = 40,
    run_dir: Annotated[
        Path | None, typer.Option(help="Where metrics and plots go (default runs/demo-<time>).")
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(envvar="REDIS_URL", help="Redis to use; embedded if unset.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Job seed.")] = 0,
    redis_wait_s: Annotated[
        float, typer.Option(min=0.1, help="How long to wait for Redis to answer.")
    ] = 15.0,
) -> None:
    """Run the main job on the embedded default and write metrics and a reward curve.

    Interim: the toy co-training loop of services/toy_demo.py (two torch policies exchanging
    statistics, episodes and manifests through Redis) until the trainer services land.
    """
    from shared_store import Store
    from shared_store.connection import StoreUnavailableError

    out = run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    try:
        with redis_url_or_embedded(redis_url, out) as url:
            store = Store.connect(url, wait_s=redis_wait_s)
            _run_demo(store, steps, seed, out)
    except (StoreUnavailableError, ValueError, RuntimeError) as exc:
        raise fail(str(exc)) from None


def _run_demo(store: Store, steps: int, seed: int, out: Path) -> None:
    from services.toy_demo import ToyConfig, run_toy

    cfg = ToyConfig(steps=steps, seed=seed)
    record, _ = store.jobs.create({"kind": "toy-demo", **cfg.__dict__})
    store.jobs.transition(record.job_id, "running")
    rows: list[dict[str, float]] = []
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[info]}"))  # fmt: skip
    with Progress(*cols, console=console) as bar, (out / "metrics.jsonl").open("w") as f:
        task = bar.add_task(f"job {record.job_id}", total=steps, info="")
        t0 = time.perf_counter()

        def on_step(step: int, metrics: dict[str, float]) -> None:
            row = {"step": step, "time_s": time.perf_counter() - t0, **metrics}
            rows.append(row)
            f.write(json.dumps(row) + "\n")
            info = f"planner success {metrics['planner/success']:.2f}  sub-agent reward {metrics.get('subagent/reward_mean', 0):.2f}"
            bar.update(task, advance=1, info=info)

        run_toy(store, record.job_id, cfg, on_step)
    store.jobs.transition(record.job_id, "succeeded")
    _plot(rows, out / "rewards.png")
    _summary(store, record.job_id, rows, out)


def _plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in rows]
    for name in ("planner/success", "planner/reward_mean", "subagent/reward_mean"):
        ax.plot(steps, [r.get(name, float("nan")) for r in rows], label=name)
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right")
    ax.set_title("mgrpo demo: toy co-training through Redis")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _summary(store: Store, job_id: str, rows: list[dict[str, float]], out: Path) -> None:
    n = max(1, len(rows) // 5)
    first = sum(r["planner/success"] for r in rows[:n]) / n
    last = sum(r["planner/success"] for r in rows[-n:]) / n
    ledger = store.ledger.entries(job_id)
    console.print(
        f"planner success: first {n} steps {first:.2f} → last {n} steps {last:.2f} "
        f"(untrained uniform policies: 0.44)\n"
        f"ledger: {sum(e.role == 'planner' for e in ledger)} planner and "
        f"{sum(e.role == 'subagent' for e in ledger)} sub-agent steps, each applied once\n"
        f"wrote {out / 'metrics.jsonl'} and {out / 'rewards.png'}"
    )


if __name__ == "__main__":  # pragma: no cover - `python -m services.cli`
    app()
