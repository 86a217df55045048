"""The `mgrpo` CLI run as a real process (python -m services.cli)."""

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from mgrpo.config import JobConfig
from mgrpo.workflows import get_workflow
from mgrpo.workflows.deep_research_warmstart import job_task
from services.launcher import free_port
from tests.services.checks import ROOT, mgrpo


def test_warmstart_progress_lines_in_a_log(tmp_path):
    """Not a terminal (a log file): plain progress lines while the warm start trains and evaluates, each
    with its rate and ETA, and the losses; a second run finds it cached."""
    args = (
        "warmstart",
        "--steps",
        "5",
        "--n-people",
        "60",
        "--eval-questions",
        "1",
        "--cache-dir",
        str(tmp_path),
    )
    proc = mgrpo(*args, env={"MGRPO_PROGRESS_EVERY_S": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("warm start ")]
    sft = [
        line for line in lines if "SFT planner loss" in line and "still working" not in line
    ]  # not heartbeats
    assert [line.split()[2] for line in sft] == [f"{i}/5" for i in range(1, 6)], lines
    assert "ETA" not in sft[0]  # no rate known after one unit: no guess
    assert all("ETA" in line and ("s/it" in line or "it/s" in line) for line in sft[1:-1])  # none once done
    evals = [
        line.split()[2]
        for line in proc.stdout.splitlines()
        if line.startswith("warm-start evaluation ") and "still working" not in line
    ]
    assert evals == [f"{i}/4" for i in range(1, 5)], proc.stdout
    assert "trained:" in proc.stdout and "heldout_stage2_T1 success" in proc.stdout
    again = mgrpo(*args)
    assert again.returncode == 0 and "cached:" in again.stdout


def test_warmstart_with_a_flawed_demonstrator_is_a_warm_start_of_its_own(tmp_path):
    """`--guess-share` (a job's `warmstart_guess_share`) keys its own cache; a workflow whose warm
    start has no such demonstrator refuses it, saying so."""
    args = (
        "warmstart",
        "--steps",
        "2",
        "--n-people",
        "60",
        "--eval-questions",
        "0",
        "--cache-dir",
        str(tmp_path),
    )
    assert mgrpo(*args).returncode == 0
    flawed = mgrpo(*args, "--guess-share", "0.5")
    assert flawed.returncode == 0 and "trained:" in flawed.stdout, (
        flawed.stdout[-2000:] + flawed.stderr[-2000:]
    )
    assert len(list(tmp_path.glob("warmstart-*/eval.json"))) == 2
    refused = mgrpo("warmstart", "--workflow", "marsrl", "--guess-share", "0.3", "--cache-dir", str(tmp_path))
    assert refused.returncode != 0 and "no flawed demonstrator" in refused.stdout + refused.stderr


def test_schema_shows_every_workflow():
    proc = mgrpo("schema")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    # a string (plugins register more names); the built-ins are its examples, each a real workflow
    listed = schema["properties"]["workflow"]["examples"]
    assert set(listed) == {"deep_research", "deep_research_team", "marsrl", "openai_agents"}
    assert all(get_workflow(name).name == name for name in listed)
    assert {e.get("workflow") for e in schema["examples"]} >= {"deep_research", "marsrl"}
    assert "roles" in schema["properties"] and "RoleConfig" in schema["$defs"]


def test_submit_and_status_errors_are_clean(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("steps: [1, 2\n")
    proc = mgrpo("submit", str(bad))
    assert proc.returncode == 2 and "not valid YAML" in proc.stdout and "Traceback" not in proc.stderr
    proc = mgrpo("submit", str(tmp_path / "missing.yaml"))
    assert proc.returncode == 2 and "no config file" in proc.stdout
    good = tmp_path / "ok.yaml"
    good.write_text("steps: 2\n")
    proc = mgrpo("submit", str(good), "--controller", "http://127.0.0.1:1")
    assert (
        proc.returncode == 2
        and "cannot reach the controller" in proc.stdout
        and "Traceback" not in proc.stderr
    )
    proc = mgrpo("status", "--controller", "http://127.0.0.1:1")
    assert proc.returncode == 2 and "cannot reach the controller" in proc.stdout
    proc = mgrpo("resume", "job-x", "--controller", "http://127.0.0.1:1")
    assert (
        proc.returncode == 2
        and "cannot reach the controller" in proc.stdout
        and "Traceback" not in proc.stderr
    )


def test_unknown_role_and_bad_option(tmp_path):
    proc = mgrpo("serve", "boss")
    assert proc.returncode == 2 and "unknown role" in proc.stdout
    proc = mgrpo("serve", "controller", "--role", "verifier")
    assert proc.returncode == 2 and "--role is for the trainer services" in proc.stdout
    proc = mgrpo("serve", "subagent", "--role", "Bad Role", env={"REDIS_URL": "redis://127.0.0.1:1/0"})
    assert proc.returncode == 2 and "MGRPO_ROLE" in proc.stdout and "Traceback" not in proc.stderr
    proc = mgrpo("demo", "--workflow", "nope")
    assert proc.returncode == 2 and "unknown workflow" in proc.stdout
    proc = mgrpo("demo", "--steps", "0")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = mgrpo("demo", "--shared", "--run-dir", str(tmp_path / "demo"))  # hosted sub-agent, no adapter
    assert proc.returncode == 2 and "add --lora 8" in proc.stdout and "Traceback" not in proc.stderr
    proc = mgrpo("serve", "controller", "--ranks", "2")
    assert proc.returncode == 2 and "--ranks is for the trainer services" in proc.stdout
    for option, bad, says in (
        ("--ranks", "planer=2", "not a trainer role"),
        ("--ranks", "subagent=0", "whole number"),
        ("--nodes", "subagent", "whole number"),
        ("--backend", "subagent=deepspeed", "ROLE=fsdp or ROLE=megatron"),
        ("--pipeline-stages", "subagent=2", "pipeline stages need"),
    ):
        proc = mgrpo("local", "up", "--run-dir", str(tmp_path), option, bad)
        assert proc.returncode == 2 and says in proc.stdout and "Traceback" not in proc.stderr, proc.stdout
    redis = {"REDIS_URL": "redis://127.0.0.1:1/0"}
    for args, says in (
        (("--nodes", "2"), "needs MGRPO_RENDEZVOUS"),
        (
            ("--nodes", "2", "--node-rank", "2", "--rendezvous", "node0:29500"),
            "MGRPO_NODE_RANK 2 is not below",
        ),
        (("--nodes", "2", "--rendezvous", "node0"), "MGRPO_RENDEZVOUS"),
        (("--backend", "megatron"), "MGRPO_RANKS (or MGRPO_NODES) of 2 or more"),
        (
            ("--ranks", "2", "--pipeline-stages", "2"),
            "MGRPO_PIPELINE_STAGES > 1 needs",
        ),
        (
            ("--ranks", "2", "--backend", "megatron", "--pipeline-stages", "4"),
            "MGRPO_PIPELINE_STAGES 4 must divide",
        ),
    ):
        proc = mgrpo("serve", "subagent", *args, env=redis)
        assert proc.returncode == 2 and says in proc.stdout and "Traceback" not in proc.stderr, proc.stdout


def test_torchrun_args_one_machine_or_several():
    from services.cli_serve import torchrun_args
    from services.settings import Settings

    assert torchrun_args(Settings(ranks=2))[2:4] == ["--standalone", "--nproc-per-node=2"]
    several = torchrun_args(Settings(ranks=1, nodes=3, node_rank=2, rendezvous="trainer-0.ranks:29400"))
    assert several[2:] == [
        "--nnodes=3",
        "--node-rank=2",
        "--master-addr=trainer-0.ranks",
        "--master-port=29400",
        "--nproc-per-node=1",
        "--max-restarts=0",
    ]


def test_train_rejects_a_bad_config_with_the_field_path(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("steps: 2\nroles:\n  planner:\n    optim:\n      lr: -1\n")
    proc = mgrpo("train", "--config", str(cfg))
    assert proc.returncode == 2 and "roles.planner.optim.lr" in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_train_runs_a_small_job_in_the_foreground(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(
        "mode: co_train\nsteps: 1\nprompts_per_step: 2\nrollouts_per_query: 2\nn_people: 100\nwarmstart_steps: 5\n"
    )
    proc = mgrpo(
        "train",
        "--config",
        str(cfg),
        "--run-dir",
        str(tmp_path / "run"),
        "--cache-dir",
        str(tmp_path / "cache"),
        drop=("REDIS_URL",),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "succeeded" in proc.stdout
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_local_up_serves_the_workflow_roles_and_stops_on_sigterm(tmp_path):
    """`mgrpo local up --workflow marsrl --shared`: the controller and the solver's trainer only (the
    other roles share its model); SIGTERM stops every service it started."""
    import signal
    import time

    import httpx

    from shared_store.embedded import free_port_block

    port = free_port_block(3)  # port + 1 from the ephemeral range was once taken by a client connection
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("REDIS_URL", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "local",
            "up",
            "--workflow",
            "marsrl",
            "--shared",
            "--port",
            str(port),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                logs = "".join(
                    f.read_text()[-1500:] for f in sorted((tmp_path / "run" / "logs").glob("*.log"))
                )
                out = proc.stdout.read() if proc.poll() is not None and proc.stdout else ""
                pytest.fail(f"local up did not come up: {out}{logs}")
            try:  # the controller and the solver's trainer both ready
                if all(
                    httpx.get(f"http://127.0.0.1:{p}/readyz", timeout=2).status_code == 200
                    for p in (port, port + 1)
                ):
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port + 1}/v1/policy").json()["role"] == "solver"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in out
    for p in (port, port + 1, port + 2):  # nothing left listening (and no verifier was started)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{p}/healthz", timeout=2)


@pytest.fixture
def example_tool_server():
    """examples/tool_server.py as the README starts it (uvicorn, a real process) on a free port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--app-dir", "examples", "tool_server:app", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/tool"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
            try:
                httpx.post(url, json={"name": "open", "argument": "d0"}, timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_train_the_example_job_with_its_tool_server(tmp_path, example_tool_server):
    """docs/guide.md "Train your own agents": the example tool endpoint answers as the built-in tools do
    over the same documents, and `mgrpo train -c examples/tools-job.yaml` from the repository root
    (its relative file:// dataset, the sub-agent's search and open through that endpoint), cut to
    one step and 4 held-out rows, trains with every tool call served."""
    import yaml

    task = job_task(JobConfig())
    for name, argument in (
        ("search", "Kir Naibram"),
        ("open", "d0"),
        ("search", "qqqq zzzz"),
        ("open", "d99999"),
    ):
        r = httpx.post(example_tool_server, json={"name": name, "argument": argument}, timeout=10)
        assert r.status_code == 200 and r.json() == {"result": task.tools[name](argument)}, (name, r.text)
    assert httpx.post(example_tool_server, json={"name": "nope", "argument": ""}).status_code == 404

    job = yaml.safe_load((ROOT / "examples" / "tools-job.yaml").read_text())
    assert {t["url"] for t in job["roles"]["subagent"]["tools"]} == {
        "http://127.0.0.1:9200/tool"
    }  # the README's
    for t in job["roles"]["subagent"]["tools"]:
        t["url"] = example_tool_server
    job |= {"steps": 1, "prompts_per_step": 2, "rollouts_per_query": 4}
    job["dataset"]["eval_queries"] = 4
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = mgrpo(
        "train",
        "-c",
        str(tmp_path / "job.yaml"),
        "--run-dir",
        str(tmp_path / "out"),
        "--cache-dir",
        str(ROOT / ".cache" / "mgrpo"),
        cwd=ROOT,
        drop=("REDIS_URL",),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "held-out success (4 rows of split test):" in proc.stdout and "succeeded" in proc.stdout
    (row,) = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert row["planner/reward_errors"] == 0 and "subagent/reward_mean" in row
    assert row["subagent/tool_calls"] > 0 and row["subagent/tool_errors"] == 0, row
