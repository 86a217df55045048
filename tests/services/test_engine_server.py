"""`mgrpo engine`: the hf engine behind SGLang's HTTP API (`services.engine_server`), through FastAPI's
test client and, for the weight push, as its own process (a weight group needs two processes)."""

import copy
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.engines.sglang import SGLangEngine, SGLangError
from mgrpo.models import build_model, save
from mgrpo.parallel.weight_group import flatten_bytes
from services.cli import app as cli
from services.engine_server import DistributedUpdate, EngineServer, make_app
from shared_store.embedded import free_port
from tests.mgrpo.sglang_standin import StandIn
from tests.mgrpo.test_engine_sglang import ROOT, assert_logprobs, wait_until_up
from tests.waiting import wait_for


@pytest.fixture
def client(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer, own_weights=True, version=4)
    with TestClient(make_app(engine, staging=tiny_model, model_path="/models/x")) as c:
        yield c
    engine.close()


def test_generate_one_prompt_or_a_batch_with_per_prompt_params(client, tiny_model, tokenizer):
    """One prompt gives one result, a batch a list in order; each prompt keeps its own sampling
    dict; the log-probs are the served model's and every result names the weights that sampled it."""
    pa = tokenizer.encode("Kir Naibram was", add_special_tokens=False)
    pb = tokenizer.encode("Dodus is", add_special_tokens=False)
    one = client.post("/generate", json={"input_ids": pa, "sampling_params": {"max_new_tokens": 3}}).json()
    assert isinstance(one, dict) and len(one["output_ids"]) == 3
    body = {
        "input_ids": [pa, pb],
        "return_logprob": True,
        "sampling_params": [
            {"max_new_tokens": 2, "sampling_seed": 1},
            {"max_new_tokens": 5, "sampling_seed": 2},
        ],
    }
    out = client.post("/generate", json=body).json()
    assert [len(o["output_ids"]) for o in out] == [2, 5]
    assert {o["meta_info"]["weight_version"] for o in out} == {"4"}
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [len(pa), len(pb)]
    samples = [SGLangEngine("http://x")._sample(o, SamplingParams(), 0) for o in out]
    assert_logprobs(tiny_model, [pa, pb], samples)
    info = client.get("/get_server_info").json()
    assert (
        info["tp_size"] == 1
        and info["model_path"] == "/models/x"
        and client.get("/health").status_code == 200
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"input_ids": [[1, 2]], "sampling_params": {"top_k": 5}}, "top_k"),
        ({"input_ids": [[1, 2], []]}, "at least one token"),
        ({"input_ids": [[1, 320]]}, "token id 320 is outside"),
        ({"input_ids": [-1, 2]}, "token id -1 is outside"),
        ({"input_ids": [[1, 2], [3]], "sampling_params": [{}, {}, {}]}, "one per prompt"),
        ({"text": "hello"}, "input_ids"),
        ({"input_ids": [[1]], "sampling_params": {"temperature": -1}}, "temperature"),
    ],
)
def test_bad_requests_get_a_422_that_names_the_problem(client, body, says):
    resp = client.post("/generate", json=body)
    assert resp.status_code == 422 and says in resp.text


def test_concurrent_calls_go_as_one_request_and_each_gets_its_own(tiny_model, tokenizer):
    """Nine episodes' calls at once (each its prompt, row count, length and seed): one /generate request
    when coalesced, nine when not; either way each call gets its own prompt's samples, in order."""
    prompts = [
        tokenizer.encode(t, add_special_tokens=False) for t in ("Kir", "Dodus is", "The capital of")
    ] * 3

    def call(eng: SGLangEngine, i: int, out: dict[int, list]) -> None:
        out[i] = eng.generate([prompts[i]] * (1 + i % 2), SamplingParams(max_new_tokens=3 + i % 3, seed=i))

    for coalesce_ms, most in ((50.0, 1), (0.0, len(prompts))):
        engine = HFEngine(tiny_model, tokenizer)
        server = StandIn(engine)
        with server as url:
            eng = SGLangEngine(url, coalesce_ms=coalesce_ms)
            out: dict[int, list] = {}
            threads = [threading.Thread(target=call, args=(eng, i, out)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            eng.close()
        engine.close()
        sent = server.calls["generate"]
        assert len(sent) <= most and sum(sent) == sum(1 + i % 2 for i in range(len(prompts))), sent
        assert len(out) == len(prompts)
        for i, samples in out.items():
            assert len(samples) == 1 + i % 2 and all(len(s.token_ids) <= 3 + i % 3 for s in samples)
            assert_logprobs(tiny_model, [prompts[i]] * len(samples), samples)
    assert len(sent) == len(prompts)  # not coalesced: one request per call
    closed = SGLangEngine(url)
    closed.close()
    with pytest.raises(SGLangError, match="closed"):  # not a call that waits forever
        closed.generate([prompts[0]], SamplingParams())


def test_a_push_swaps_weights_between_steps_without_waiting_for_running_rows(tiny_model, tokenizer, tmp_path):
    """`mgrpo engine` in its own process: a push by broadcast returns while a long rollout still runs;
    that rollout finishes on the weights it started with (and says so), and a request after the push
    samples from the pushed weights. The first push goes a tensor per broadcast, the second in many
    flattened buckets: both over a real gloo group."""
    folder = save(build_model("tiny", tokenizer, seed=5), tokenizer, tmp_path / "served")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "engine",
            str(folder),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    eng = None
    try:
        wait_until_up(url)
        per_tensor = SGLangEngine(url, weight_sync="distributed", sync_host="127.0.0.1", weight_bucket_mb=0)
        per_tensor.push_weights(tiny_model, 1)  # one broadcast a tensor: SGLang's protocol before buckets
        per_tensor.close()
        eng = SGLangEngine(url, weight_sync="distributed", sync_host="127.0.0.1", weight_bucket_mb=0.1)
        prompt = tokenizer.encode("Kir Naibram was", add_special_tokens=False)
        trained = build_model("tiny", tokenizer, seed=9)
        long: list = []
        ended = threading.Event()
        runner = threading.Thread(
            target=lambda: (  # 64 rows: some run to 400 tokens (no EOS)
                long.extend(eng.generate([prompt] * 64, SamplingParams(max_new_tokens=400))),
                ended.set(),
            )
        )
        before = httpx.get(f"{url}/get_server_info").json()["forward_passes"]
        runner.start()
        decoding = lambda: httpx.get(f"{url}/get_server_info").json()["forward_passes"] > before + 1  # noqa: E731
        wait_for(decoding, what="the long rollout decoding")
        t0 = time.perf_counter()
        eng.push_weights(trained, 2)  # in 0.1 MB buckets: 1.7 MB of weights, a broadcast and a call each
        pushed = time.perf_counter() - t0
        assert not ended.is_set(), f"the push ({pushed:.2f} s) returned only after the running rollout ended"
        (short,) = eng.generate([prompt], SamplingParams(max_new_tokens=4, seed=4))
        assert short.weights_version == 2
        assert_logprobs(trained, [prompt], [short])
        runner.join()
        assert {s.weights_version for s in long} == {1} and max(len(s.token_ids) for s in long) == 400
        assert_logprobs(tiny_model, [prompt] * len(long), long)
    finally:
        if eng is not None:
            eng.close()
        proc.terminate()
        proc.wait(timeout=10)


def test_a_policy_pushed_in_buckets_is_served_only_once_every_bucket_came(tiny_model, tokenizer, monkeypatch):
    """SGLang's `load_format: flattened_bucket`, a policy in two buckets: after the first the server
    still samples from the old weights (never half of each); after the second from the pushed ones,
    every tensor unpacked into its place. Here the broadcast hands over the trainer's packed bytes in
    this process (a real group needs two: the test above pushes real buckets)."""
    engine = HFEngine(tiny_model, tokenizer, own_weights=True, version=1)
    server = EngineServer(engine, copy.deepcopy(tiny_model), None)
    server.groups["g"] = None
    trained = build_model("tiny", tokenizer, seed=9)
    named = list(trained.named_parameters())
    sent: list[torch.Tensor] = []
    monkeypatch.setattr(torch.distributed, "broadcast", lambda buffer, src, group: buffer.copy_(sent.pop()))
    prompt = tokenizer.encode("Kir Naibram was", add_special_tokens=False)
    try:
        for bucket, last in ((named[:7], False), (named[7:], True)):
            sent.append(flatten_bytes([p for _, p in bucket]))
            out = server.update_distributed(
                DistributedUpdate(
                    names=[n for n, _ in bucket],
                    dtypes=["float32"] * len(bucket),
                    shapes=[list(p.shape) for _, p in bucket],
                    group_name="g",
                    weight_version="2",
                    load_format="flattened_bucket",
                )
            )
            assert out["success"] and not sent
            (got,) = engine.generate([prompt], SamplingParams(max_new_tokens=3, seed=1))
            assert got.weights_version == (2 if last else 1)
            assert_logprobs(trained if last else tiny_model, [prompt], [got])
    finally:
        engine.close()


def test_the_command_refuses_a_folder_without_a_model(tmp_path):
    result = CliRunner().invoke(cli, ["engine", str(tmp_path)])
    assert result.exit_code == 2 and "config.json" in result.output and "Traceback" not in result.output


# ---- LoRA roles: adapters pushed as folders (SGLang's LoRA API) ------------------------------------


def lora_role(base, tmp_path, url, *, last_step=-1):
    from mgrpo.config import JobConfig
    from mgrpo.role_model import RoleModel
    from mgrpo.runtime import Placement
    from mgrpo.workflows import job_spec

    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    cfg = JobConfig(roles={"planner": {"model": {"path": str(base)}, "lora": lora, "optim": {"lr": 1e-2}}})
    placement = Placement(cache_dir=tmp_path, checkpoint_dir=tmp_path, sglang_url=url)
    return RoleModel(job_spec(cfg), "planner", placement=placement, job_id="j", last_step=last_step)


def served_engine(base):
    from mgrpo.models import load

    model, tokenizer = load(base)
    return HFEngine(model, tokenizer, own_weights=True), model


PROMPTS = [[5, 6, 7], [8, 9]]


def assert_samples_from_adapter(m, version):
    """The role's rollouts come from policy `version`, with the trained base + adapter's log-probs."""
    out = m.engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, seed=1))
    assert [s.weights_version for s in out] == [version] * len(PROMPTS)
    with torch.no_grad():
        assert_logprobs(m.adapter.peft, PROMPTS, out)


def test_a_lora_role_sends_its_servers_adapter_folders_only(tokenizer, tmp_path):
    """A LoRA role on `mgrpo engine` (real HTTP, the real client): the server starts on the base, then
    takes each checkpoint as an adapter folder (`/load_lora_adapter`, never a full update), every
    `/generate` names the newest adapter, and what it samples is the trained base + adapter's
    distribution; a restarted trainer hands a fresh server the adapter it resumes from."""
    from tests.mgrpo.test_role_model import samples_of

    base = save(build_model("tiny", tokenizer, seed=0), tokenizer, tmp_path / "base")
    engine, staging = served_engine(base)
    standin = StandIn(engine, staging=staging)
    with standin as url:
        m = lora_role(base, tmp_path, url)
        try:
            for step in range(2):
                m.update(samples_of(m, [step, step]), seed=step)
                m.save(step)
            assert_samples_from_adapter(m, 2)
        finally:
            m.close()
    assert standin.calls["update"] == [str(base)]  # the base, once; after that adapters only
    assert standin.calls["load_lora"] == ["mgrpo-planner-v1", "mgrpo-planner-v2"]
    assert standin.calls["generate_lora"][-1] == ["mgrpo-planner-v2", "mgrpo-planner-v2"]

    engine, staging = served_engine(base)  # a new server, the trainer restarted after step 1
    standin = StandIn(engine, staging=staging)
    with standin as url:
        resumed = lora_role(base, tmp_path, url, last_step=1)
        try:
            assert_samples_from_adapter(resumed, 2)
        finally:
            resumed.close()
    assert standin.calls["load_lora"] == ["mgrpo-planner-v2"]


def adapter_folder(base, folder, targets, seed):
    """A peft LoRA adapter on `base` with nonzero lora_B (so it changes what the base samples)."""
    from peft import LoraConfig, get_peft_model

    from mgrpo.models import load

    torch.manual_seed(seed)
    peft = get_peft_model(load(base)[0], LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    peft.peft_config["default"].base_model_name_or_path = str(base)
    peft.save_pretrained(folder)
    return folder


def test_the_server_serves_each_roles_adapter_on_the_base_it_kept(tokenizer, tmp_path):
    """Adapters of two roles (families) and a newer one of the first on other layers: each request
    samples from base + the adapter it names (equal to peft's own merge), one naming none from the
    base; an unknown adapter name is a 400 and a folder that is no adapter a refusal."""
    from mgrpo.models import load

    base = save(build_model("tiny", tokenizer, seed=0), tokenizer, tmp_path / "base")
    folders = {
        name: adapter_folder(base, tmp_path / name, targets, seed)
        for seed, (name, targets) in enumerate(
            (("mgrpo-a-v1", ["q_proj"]), ("mgrpo-b-v1", ["down_proj"]), ("mgrpo-a-v2", ["down_proj"]))
        )
    }
    engine, staging = served_engine(base)
    prompt = [5, 6, 7, 8]
    try:
        with TestClient(app := make_app(engine, staging=staging)) as c:
            for name, folder in folders.items():
                r = c.post("/load_lora_adapter", json={"lora_name": name, "lora_path": str(folder)})
                assert r.json()["success"], r.json()
            names = ["mgrpo-a-v2", "mgrpo-b-v1", None]
            body = {"input_ids": [prompt] * 3, "lora_path": names, "return_logprob": True}
            body["sampling_params"] = {"max_new_tokens": 5, "sampling_seed": 3}
            out = c.post("/generate", json=body).json()
            assert [o["meta_info"].get("lora_version") for o in out] == ["2", "1", None]
            samples = [SGLangEngine("http://x")._sample(o, SamplingParams(), 0) for o in out]
            with torch.no_grad():
                for name, sample in zip(names, samples, strict=True):
                    assert_logprobs(load(folders[name] if name else base)[0], [prompt], [sample])
            server = app.state.server
            assert server.adapters.engine_for(None) is engine and len(server.adapters.engines) == 2
            r = c.post("/generate", json={"input_ids": [1, 2], "lora_path": "nope-v1"})
            assert r.status_code == 400 and "/load_lora_adapter" in r.json()["detail"]
            r = c.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": str(base)})
            assert not r.json()["success"] and "not a peft adapter folder" in r.json()["error_message"]
            assert c.post("/unload_lora_adapter", json={"lora_name": "mgrpo-a-v1"}).json()["success"]
            r = c.post("/generate", json={"input_ids": [1, 2], "lora_path": "mgrpo-a-v1"})
            assert r.status_code == 400
    finally:
        engine.close()


def test_two_roles_on_one_base_share_a_server_each_with_its_own_adapters(tokenizer, tmp_path):
    """A hosted sub-agent on the planner's base, both LoRA roles rolling out on one `mgrpo engine`:
    the base goes to the server once (by the planner), each role's adapters under its own names, and
    each role samples from the base + its own trained adapter."""
    from mgrpo.config import JobConfig
    from mgrpo.role_model import RoleModel
    from mgrpo.runtime import Placement
    from mgrpo.workflows import job_spec
    from tests.mgrpo.test_role_model import samples_of

    base = save(build_model("tiny", tokenizer, seed=0), tokenizer, tmp_path / "base")
    lora = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    roles = {
        "planner": {"model": {"path": str(base)}, "lora": lora, "optim": {"lr": 1e-2}},
        "subagent": {"share_model_with": "planner", "lora": lora, "optim": {"lr": 1e-2}},
    }
    job = job_spec(JobConfig(roles=roles))
    engine, staging = served_engine(base)
    standin = StandIn(engine, staging=staging)
    with standin as url:
        placement = Placement(cache_dir=tmp_path, checkpoint_dir=tmp_path, sglang_url=url)
        root = RoleModel(job, "planner", placement=placement, job_id="j", last_step=-1)
        head = RoleModel(job, "subagent", placement=placement, job_id="j", last_step=-1, base_of=root)
        try:
            for step in range(2):
                for m in (root, head):
                    m.update(samples_of(m, [step, step + 1]), seed=step)
                    m.save(step)
            for m in (root, head):
                assert_samples_from_adapter(m, 2)
        finally:
            head.close()
            root.close()
    assert standin.calls["update"] == [str(base)]  # the base once, by the planner
    assert standin.calls["load_lora"] == [
        f"mgrpo-{role}-v{v}" for v in (1, 2) for role in ("planner", "subagent")
    ]
