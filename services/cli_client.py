"""The `mgrpo` commands that talk to a running controller over REST, like kubectl: `submit`,
`dataset upload|list`, `status`, `resume`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from services.cli_base import app, console, fail, read_config


def _client(url: str, token: str) -> Any:
    import httpx

    return httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=30
    )


ControllerOpt = Annotated[str, typer.Option(envvar="MGRPO_CONTROLLER_URL", help="Controller URL.")]
TokenOpt = Annotated[str, typer.Option(envvar="MGRPO_API_TOKEN", help="Bearer token.")]
ReadTokenOpt = Annotated[
    str,
    typer.Option(
        "--api-token", envvar=["MGRPO_READ_TOKEN", "MGRPO_API_TOKEN"], help="Bearer token (read or admin)."
    ),
]


@app.command()
def submit(
    config: Annotated[Path, typer.Argument(help="Job config (YAML or JSON).")],
    controller: ControllerOpt = "http://127.0.0.1:8000",
    api_token: TokenOpt = "",
    job_id: Annotated[str | None, typer.Option(help="Idempotency: the same id returns the same job.")] = None,
) -> None:
    """Submit a job to a running controller (like `kubectl apply -f`)."""
    import httpx

    body = read_config(config)
    try:
        with _client(controller, api_token) as http:
            resp = http.post("/v1/jobs", json=body, params={"job_id": job_id} if job_id else None)
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the controller at {controller}: {exc}") from None
    if resp.status_code != 201:
        raise fail(f"the controller refused the job ({resp.status_code}): {resp.text}")
    console.print(f"job [bold]{resp.json()['job_id']}[/] {resp.json()['status']}")


dataset_app = typer.Typer(help="Datasets in the controller's store (what a job's dataset.source names).")
app.add_typer(dataset_app, name="dataset")


@dataset_app.command("upload")
def dataset_upload(
    file: Annotated[
        Path,
        typer.Argument(help="A JSONL or Parquet file: rows of query, answer, optional split, id, metadata."),
    ],
    name: Annotated[str, typer.Option(help="A label for people (default: the file name).")] = "",
    controller: ControllerOpt = "http://127.0.0.1:8000",
    api_token: TokenOpt = "",
) -> None:
    """Upload a dataset (like `huggingface-cli upload`); prints its id for the job's dataset.source."""
    import httpx

    if not file.is_file():
        raise fail(f"no file at {file}")
    try:
        with _client(controller, api_token) as http:
            resp = http.post(
                "/v1/datasets",
                content=file.read_bytes(),
                params={"name": name or file.name},
                headers={"Content-Type": "application/octet-stream"},
            )
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the controller at {controller}: {exc}") from None
    if resp.status_code not in (200, 201):
        raise fail(
            f"the controller refused {file} ({resp.status_code}): {resp.json().get('detail', resp.text)}"
        )
    d = resp.json()
    splits = ", ".join(f"{k} {n}" for k, n in d["splits"].items())
    console.print(
        f"dataset [bold]{d['dataset_id']}[/] {'uploaded' if d['created'] else 'already there'}: {d['rows']} rows ({splits})"
    )


@dataset_app.command("list")
def dataset_list(controller: ControllerOpt = "http://127.0.0.1:8000", api_token: ReadTokenOpt = "") -> None:
    """List the uploaded datasets (like `kubectl get`)."""
    import httpx
    from rich.table import Table

    try:
        with _client(controller, api_token) as http:
            resp = http.get("/v1/datasets")
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the controller at {controller}: {exc}") from None
    if resp.status_code != 200:
        raise fail(f"{resp.status_code}: {resp.json().get('detail', resp.text)}")
    table = Table("DATASET", "NAME", "ROWS", "SPLITS")
    for d in resp.json()["datasets"]:
        table.add_row(
            d["dataset_id"], d["name"], str(d["rows"]), ", ".join(f"{k} {n}" for k, n in d["splits"].items())
        )
    console.print(table)


@app.command()
def status(
    job_id: Annotated[str | None, typer.Argument(help="A job id; all jobs when omitted.")] = None,
    controller: ControllerOpt = "http://127.0.0.1:8000",
    api_token: ReadTokenOpt = "",
) -> None:
    """Show jobs (like `kubectl get`)."""
    import httpx
    from rich.table import Table

    try:
        with _client(controller, api_token) as http:
            resp = http.get(f"/v1/jobs/{job_id}" if job_id else "/v1/jobs")
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the controller at {controller}: {exc}") from None
    if resp.status_code != 200:
        raise fail(f"{resp.status_code}: {resp.json().get('detail', resp.text)}")
    jobs = [resp.json()] if job_id else resp.json()["jobs"]
    table = Table("JOB", "STATUS", "WORKFLOW", "STEPS DONE (per role)", "REASON")
    for j in jobs:
        done = "  ".join(f"{r} {s + 1}" for r, s in j["steps_done"].items())
        cfg = j["config"]
        flow = cfg.get("workflow", "deep_research") + (
            f" ({cfg['mode']})" if cfg.get("mode", "co_train") != "co_train" else ""
        )
        table.add_row(j["job_id"], j["status"], flow, f"{done} of {cfg.get('steps')}", j["reason"][:60])
    console.print(table)


@app.command()
def resume(
    job_id: Annotated[str, typer.Argument(help="A failed or cancelled job's id.")],
    controller: ControllerOpt = "http://127.0.0.1:8000",
    api_token: TokenOpt = "",
) -> None:
    """Run a failed or cancelled job on from its last finished step."""
    import httpx

    try:
        with _client(controller, api_token) as http:
            resp = http.post(f"/v1/jobs/{job_id}/resume")
    except httpx.HTTPError as exc:
        raise fail(f"cannot reach the controller at {controller}: {exc}") from None
    if resp.status_code != 200:
        raise fail(
            f"the controller did not resume {job_id} ({resp.status_code}): {resp.json().get('detail', resp.text)}"
        )
    console.print(f"job [bold]{job_id}[/] {resp.json()['status']}")
