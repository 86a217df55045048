"""Deployment files checked offline: the Helm chart rendered and linted by an embedded Helm and every
manifest validated against the Kubernetes schemas; docker-compose.yml validated by docker-compose;
and the wiring: every command is a real CLI entry point, every environment name a settings field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import typer
import yaml

from services.cli import app
from services.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "k8s" / "mgrpo"
GPU_VALUES = yaml.safe_load((CHART / "values-gpu.yaml").read_text())
MARSRL_VALUES = yaml.safe_load((CHART / "values-marsrl.yaml").read_text())
K8S_VERSION = kubernetes_validate.latest_version()
KINDS = {"controller", "planner", "subagent"}


def render(values: dict) -> list[dict]:
    out = helm.Chart.load(str(CHART)).render(values, name="rel", namespace="default")
    return [d for path, text in out.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]


def settings_env_names() -> set[str]:
    names = set()
    for name, field in Settings.model_fields.items():
        names.add(
            field.validation_alias if isinstance(field.validation_alias, str) else f"MGRPO_{name.upper()}"
        )
    return names


@pytest.mark.parametrize(
    "values",
    [{"apiToken": "t"}, {**GPU_VALUES, "apiToken": "t"}, {**MARSRL_VALUES, "apiToken": "t"}],
    ids=["default", "gpu", "marsrl"],
)
def test_chart_renders_lints_and_validates(values):
    docs = render(values)
    kinds = sorted(d["kind"] for d in docs)
    n = len(values.get("roles", [None, None]))  # one Deployment, Service and PVC per role
    assert (
        kinds.count("Deployment") == n + 1
        and "StatefulSet" in kinds
        and kinds.count("PersistentVolumeClaim") == n
    )
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{K8S_VERSION}")
    assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report


@pytest.mark.parametrize(
    ("values", "kinds"),
    [
        (GPU_VALUES, {"planner": "planner", "subagent": "subagent"}),
        (MARSRL_VALUES, {"solver": "planner", "verifier": "subagent", "corrector": "subagent"}),
    ],
    ids=["deep_research", "marsrl"],
)
def test_gpu_values_put_each_role_on_its_own_gpu_node(values, kinds):
    docs = render({**values, "apiToken": "t"})
    trainers = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] != "controller"
    }
    assert set(trainers) == set(kinds)
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
    urls = json.loads(config["MGRPO_ROLE_URLS"])  # the root reaches every callee role's Service
    assert urls == {r: f"http://rel-mgrpo-{r}:8000" for r, k in kinds.items() if k == "subagent"}
    for role, spec in trainers.items():
        (c,) = spec["containers"]
        assert c["args"][:2] == ["serve", kinds[role]]
        assert {"name": "MGRPO_ROLE", "value": role} in c["env"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert spec["nodeSelector"] == {"mgrpo.io/pool": f"{role}-gpu"} and spec["tolerations"]
        term = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        (expr,) = term["labelSelector"]["matchExpressions"]
        assert set(expr["values"]) == set(kinds) - {role}  # never on a node with another role
        assert (
            c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        )


def test_a_role_on_two_ranks_gets_them_and_shared_memory():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["roles"][1]["ranks"] = 2
    docs = render({**values, "apiToken": "t"})
    specs = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] == "Deployment"
    }
    for role, w in (("planner", "1"), ("subagent", "2")):
        (c,) = specs[role]["containers"]
        assert {"name": "MGRPO_RANKS", "value": w} in c["env"], role
        shm = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert bool(shm) == (w == "2"), role
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in specs["subagent"]["volumes"]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_role_on_three_nodes_gets_a_node_statefulset_meeting_at_node_0():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["roles"][0] |= {"nodes": 3, "ranks": 2, "backend": "megatron", "pipelineStages": 2}
    docs = render({**values, "apiToken": "t"})
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    leader = by[("Deployment", "rel-mgrpo-planner")]["spec"]["template"]
    nodes = by[("StatefulSet", "rel-mgrpo-planner-node")]["spec"]
    meet = by[("Service", "rel-mgrpo-planner-rendezvous")]["spec"]
    assert nodes["replicas"] == 2 and nodes["ordinals"] == {"start": 1}  # pods planner-node-1, -2
    assert (
        nodes["podManagementPolicy"] == "Parallel" and nodes["serviceName"] == "rel-mgrpo-planner-rendezvous"
    )
    (lc,), (nc,) = leader["spec"]["containers"], nodes["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in nc["env"]}
    assert env["MGRPO_NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}
    }
    for c in (lc, nc):
        assert {"name": "MGRPO_NODES", "value": "3"} in c["env"]
        assert {"name": "MGRPO_BACKEND", "value": "megatron"} in c["env"]
        assert {"name": "MGRPO_PIPELINE_STAGES", "value": "2"} in c["env"]
        assert {"name": "MGRPO_RENDEZVOUS", "value": "rel-mgrpo-planner-rendezvous:29500"} in c["env"]
    assert "MGRPO_NODE_RANK" not in {e["name"] for e in lc["env"]}  # node 0: the default
    # node 0 (only) behind the rendezvous, found before it is ready (it is ready once every node joined)
    assert meet["clusterIP"] == "None" and meet["publishNotReadyAddresses"] is True
    assert leader["metadata"]["labels"] | meet["selector"] == leader["metadata"]["labels"]  # selects node 0
    assert meet["selector"]["app.kubernetes.io/component"] == "planner"
    assert nodes["template"]["metadata"]["labels"]["app.kubernetes.io/component"] != "planner"
    assert {"name": "data", "emptyDir": {}} in nodes["template"]["spec"]["volumes"]
    assert not any(d["kind"] == "StatefulSet" and "subagent" in d["metadata"]["name"] for d in docs)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_a_role_with_sglang_replicas_gets_them_and_pushes_to_each():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    values["roles"][1]["sglang"] = {"replicas": 2, "modelPath": "/data/base"}
    docs = render({**values, "apiToken": "t"})
    by = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    replicas = by[("StatefulSet", "rel-mgrpo-subagent-sglang")]["spec"]
    assert (
        replicas["replicas"] == 2
        and by[("Service", "rel-mgrpo-subagent-sglang")]["spec"]["clusterIP"] == "None"
    )
    (c,) = replicas["template"]["spec"]["containers"]
    assert c["command"][-2:] == ["--model-path", "/data/base"]
    trainer = by[("Deployment", "rel-mgrpo-subagent")]["spec"]["template"]["spec"]["containers"][0]
    urls = next(e["value"] for e in trainer["env"] if e["name"] == "MGRPO_SGLANG_URL").split(",")
    assert urls == [f"http://rel-mgrpo-subagent-sglang-{i}.rel-mgrpo-subagent-sglang:30000" for i in range(2)]
    assert by[("PersistentVolumeClaim", "rel-mgrpo-subagent-data")]["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    assert by[("PersistentVolumeClaim", "rel-mgrpo-planner-data")]["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert not any(d["kind"] == "StatefulSet" and "planner" in d["metadata"]["name"] for d in docs)
    assert not any(e["name"] == "MGRPO_SGLANG_SYNC_HOST" for e in trainer["env"])  # disk by default
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    values["roles"][1]["sglang"]["weightSync"] = "distributed"
    docs = render({**values, "apiToken": "t"})
    trainer = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "rel-mgrpo-subagent"
    )
    env = trainer["spec"]["template"]["spec"]["containers"][0]["env"]
    (host,) = [e for e in env if e["name"] == "MGRPO_SGLANG_SYNC_HOST"]
    assert host["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    values["roles"][1]["sglang"]["server"] = "mgrpo"  # the hf engine behind SGLang's API, from our image
    by = {(d["kind"], d["metadata"]["name"]): d for d in render({**values, "apiToken": "t"})}
    (c,) = by[("StatefulSet", "rel-mgrpo-subagent-sglang")]["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["mgrpo", "engine", "/data/base", "--host", "0.0.0.0", "--port", "30000"]
    assert (
        c["image"]
        == by[("Deployment", "rel-mgrpo-subagent")]["spec"]["template"]["spec"]["containers"][0]["image"]
    )
    kubernetes_validate.validate(by[("StatefulSet", "rel-mgrpo-subagent-sglang")], K8S_VERSION, strict=True)
    values["roles"][1]["sglang"]["modelPath"] = ""
    with pytest.raises(Exception, match=r"roles\[\]\.sglang\.modelPath"):
        render({**values, "apiToken": "t"})


def test_the_secret_holds_every_scope_and_a_generated_service_token():
    secret = next(d for d in render({"apiToken": "t", "readToken": "r"}) if d["kind"] == "Secret")[
        "stringData"
    ]
    assert secret["MGRPO_API_TOKEN"] == "t" and secret["MGRPO_READ_TOKEN"] == "r"
    assert len(secret["MGRPO_SERVICE_TOKEN"]) == 40  # users' tokens cannot call trainer endpoints
    given = next(d for d in render({"apiToken": "t", "serviceToken": "s"}) if d["kind"] == "Secret")
    assert given["stringData"]["MGRPO_SERVICE_TOKEN"] == "s"


def test_external_redis_and_a_missing_token():
    docs = render({"apiToken": "t", "redis": {"enabled": False, "url": "rediss://:pw@redis.example:6380/0"}})
    assert "StatefulSet" not in {d["kind"] for d in docs}
    config = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config["data"]["REDIS_URL"] == "rediss://:pw@redis.example:6380/0"
    with pytest.raises(helm.HelmRenderError, match="apiToken"):
        render({})
    with pytest.raises(helm.HelmRenderError, match=r"redis\.url"):
        render({"apiToken": "t", "redis": {"enabled": False}})


def compose(*args: str, token: str | None = "t", **extra: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (make test installs Debian's package when it can)")
    env = {k: v for k, v in os.environ.items() if k != "MGRPO_API_TOKEN"}
    if token is not None:
        env["MGRPO_API_TOKEN"] = token
    env |= extra
    return subprocess.run(
        [exe, "-f", str(ROOT / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )


def test_compose_file_is_valid():
    assert compose("config", "-q").returncode == 0
    assert compose("--profile", "gpu", "config", "-q").returncode == 0
    assert compose("--profile", "marsrl", "config", "-q").returncode == 0
    assert compose("--profile", "ranks", "config", "-q").returncode == 0
    no_token = compose("config", "-q", token=None)
    assert no_token.returncode != 0 and "MGRPO_API_TOKEN" in no_token.stderr
    # where no registry is reachable: a base image and a Redis image of one's own
    spec = yaml.safe_load(compose("config", MGRPO_BASE_IMAGE="base:1", MGRPO_REDIS_IMAGE="my/redis:1").stdout)
    assert spec["services"]["redis"]["image"] == "my/redis:1"
    assert spec["services"]["controller"]["build"]["args"]["PYTHON_IMAGE"] == "base:1"
    # a role on W ranks: MGRPO_SUBAGENT_RANKS reaches the sub-agent's service as MGRPO_RANKS, not the planner's
    spec = yaml.safe_load(compose("config", MGRPO_SUBAGENT_RANKS="2").stdout)
    assert str(spec["services"]["subagent"]["environment"]["MGRPO_RANKS"]) == "2"
    assert str(spec["services"]["planner"]["environment"]["MGRPO_RANKS"]) == "1"
    # the `ranks` profile: a sub-agent on 2 ranks with shared memory, and a planner that calls it
    ranks = yaml.safe_load(compose("--profile", "ranks", "config").stdout)["services"]
    sub, planner = ranks["subagent-ranks"], ranks["planner-ranks"]
    assert str(sub["environment"]["MGRPO_RANKS"]) == "2" and sub["shm_size"]
    assert sub["command"] == ranks["subagent"]["command"]
    assert planner["environment"]["MGRPO_SUBAGENT_URL"] == "http://subagent-ranks:8000"
    assert "subagent-ranks" in planner["depends_on"]
    assert str(planner["environment"]["MGRPO_RANKS"]) == "1"


def commands_and_env() -> tuple[list[list[str]], set[str]]:
    spec = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands, env = [], set()
    for service in spec["services"].values():
        if service.get("image", "").startswith("mgrpo"):
            commands.append(service["command"])
            env |= set(service.get("environment", {}))
    roles = [
        {**GPU_VALUES["roles"][0], "nodes": 2},
        *GPU_VALUES["roles"][1:],
    ]  # with a role's node StatefulSet
    for doc in render({**GPU_VALUES, "roles": roles, "apiToken": "t"}):
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if not c["image"].startswith("mgrpo"):
                    continue  # Redis
                commands.append(c["args"])
                env |= {e["name"] for e in c.get("env", [])}
        if doc["kind"] in ("ConfigMap", "Secret") and "grafana_dashboard" not in doc["metadata"]["labels"]:
            env |= set(doc.get("data", {})) | set(doc.get("stringData", {}))
    return commands, env


def test_the_chart_ships_the_grafana_dashboard_for_the_sidecar():
    dashboards = [d for d in render({"apiToken": "t"}) if d["metadata"]["name"] == "rel-mgrpo-dashboard"]
    assert len(dashboards) == 1 and dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "mgrpo.json").read_text())
    assert json.loads(dashboards[0]["data"]["mgrpo.json"]) == shipped and len(shipped["panels"]) >= 8
    off = render({"apiToken": "t", "grafana": {"dashboard": False}})
    assert not [d for d in off if d["metadata"]["name"].endswith("-dashboard")]


def test_every_command_is_a_cli_entry_point_and_every_env_name_a_setting():
    commands, env = commands_and_env()
    cli = typer.main.get_command(app)
    assert len(commands) >= 6
    for command in commands:
        assert command[0] in cli.commands, f"{command} is not an mgrpo command"  # type: ignore[attr-defined]
        assert command[0] == "serve" and command[1] in KINDS, command
    unknown = env - settings_env_names()
    assert not unknown, f"environment names that no settings field reads: {sorted(unknown)}"
