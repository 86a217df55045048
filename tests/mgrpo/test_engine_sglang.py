"""The SGLang client against a stand-in server that speaks SGLang's JSON (no GPU in CI), and a
`gpu`-marked test against a real SGLang server (set SGLANG_URL, or run on a GPU machine)."""

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.engines.replicas import ReplicatedEngine
from mgrpo.engines.sglang import SGLangEngine, SGLangError
from mgrpo.models import build_model, load, save, token_logprobs
from mgrpo.runtime import rollout_engine
from shared_store.embedded import free_port
from tests.mgrpo.sglang_standin import StandIn

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def standin(tiny_model, tokenizer):
    hf = HFEngine(tiny_model, tokenizer)
    with StandIn(hf) as url:
        yield url
    hf.close()


def test_generate_through_sglang_json(standin, tiny_model, tokenizer):
    eng = SGLangEngine(standin, eos_token_id=tokenizer.eos_token_id)
    prompts = [
        tokenizer.encode("Kir Naibram was", add_special_tokens=False),
        tokenizer.encode("Dodus is", add_special_tokens=False),
    ]
    out = eng.generate(prompts, SamplingParams(max_new_tokens=10, seed=3))
    assert len(out) == 2
    for p, s in zip(prompts, out, strict=True):
        assert 1 <= len(s.token_ids) == len(s.logprobs) <= 10
        ids = torch.tensor([p + s.token_ids])
        ref = token_logprobs(tiny_model, ids, torch.ones_like(ids))[0, len(p) - 1 :]
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4)
    stop = out[0].token_ids[0]
    (s,) = eng.generate(prompts[:1], SamplingParams(max_new_tokens=10, seed=3, stop_token_ids=(stop,)))
    assert s.finish_reason == "stop" and s.token_ids == [stop]


def test_update_weights_and_errors(standin, tiny_model, tokenizer, tmp_path):
    eng = SGLangEngine(standin)
    before = [p.clone() for p in tiny_model.parameters()]
    save(build_model("tiny", tokenizer, seed=9), tokenizer, tmp_path / "v2")
    try:
        eng.update_weights(str(tmp_path / "v2"))
        assert not torch.equal(next(tiny_model.parameters()), before[0])
        with pytest.raises(SGLangError, match="refused"):
            eng.update_weights(str(tmp_path))
    finally:
        with torch.no_grad():
            for p, b in zip(tiny_model.parameters(), before, strict=True):
                p.copy_(b)
    with pytest.raises(SGLangError, match="unreachable"):
        SGLangEngine("http://127.0.0.1:1", timeout_s=1).generate([[1]], SamplingParams())
    gone = SGLangEngine("http://127.0.0.1:1", timeout_s=1, weight_sync="distributed", sync_host="127.0.0.1")
    with pytest.raises(SGLangError, match="unreachable"):
        gone.push_weights(tiny_model, 1)


def test_replicas_route_by_prefix_and_all_take_every_policy(tiny_model, tokenizer, tmp_path):
    """Two stand-in servers behind one ReplicatedEngine: a query group's prompts stay on one replica,
    a new group goes to the less loaded one, the samples come back in order with the served model's
    log-probs; after `update_weights` every replica's log-probs equal the new model's teacher-forced ones."""
    models = [copy.deepcopy(tiny_model) for _ in range(2)]
    engines = [HFEngine(m, tokenizer) for m in models]
    servers = [StandIn(e) for e in engines]
    with servers[0] as a, servers[1] as b:
        calls = [s.calls for s in servers]
        start = save(tiny_model, tokenizer, tmp_path / "v1")  # what a trainer's engine starts from
        eng = rollout_engine(tiny_model, tokenizer, f"{a}, {b}", weights=str(start))
        assert isinstance(eng, ReplicatedEngine) and [c["update"] for c in calls] == [[str(start)]] * 2
        pa = tokenizer.encode("Kir Naibram was", add_special_tokens=False)
        pb = tokenizer.encode("Dodus is", add_special_tokens=False)
        prompts = [pa, pb, pa, pb, pa, pb]
        out = eng.generate(prompts, SamplingParams(max_new_tokens=6, seed=1))
        assert [c["generate"] for c in calls] == [[3], [3]]  # one sub-batch per group, one group each
        assert eng.route([pb, pa]) == [1, 0] and eng.in_flight == [1, 1]  # the same homes again
        eng.in_flight = [0, 0]
        assert_logprobs(tiny_model, prompts, out)
        save(build_model("tiny", tokenizer, seed=9), tokenizer, tmp_path / "v2")
        eng.update_weights(str(tmp_path / "v2"), version=3)
        assert eng.weights_version == 3 and [c["update"][-1] for c in calls] == [str(tmp_path / "v2")] * 2
        trained = load(tmp_path / "v2")[0]
        for p in (pa, pb):  # pa is served by replica 0, pb by replica 1
            (s,) = eng.generate([p], SamplingParams(max_new_tokens=6, seed=2))
            assert s.weights_version == 3
            assert_logprobs(trained, [p], [s])
        with pytest.raises(SGLangError, match="refused"):
            eng.update_weights(str(tmp_path), version=4)  # not a model folder
        assert eng.weights_version == 3
        eng.close()


def test_distributed_push_reaches_every_replica(tiny_model, tokenizer, tmp_path):
    """`sync_host` set: the weights go over real torch.distributed groups (gloo here; NCCL to real SGLang
    servers on GPUs, which CI cannot run) to two stand-in servers, each in its own process and started
    from another model. The engine pushes the trainer's model first, then each new policy; after each
    push both replicas' log-probs are the pushed model's, and each replica's group is opened once."""
    folder = save(build_model("tiny", tokenizer, seed=5), tokenizer, tmp_path / "other")
    ports = [free_port(), free_port()]
    servers = [
        subprocess.Popen([sys.executable, "-m", "tests.mgrpo.sglang_standin", str(folder), str(p)], cwd=ROOT)
        for p in ports
    ]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    eng = None
    try:
        for url in urls:
            wait_until_up(url)
        eng = rollout_engine(tiny_model, tokenizer, ",".join(urls), weights="unused", sync_host="127.0.0.1")
        assert isinstance(eng, ReplicatedEngine) and eng.weight_sync == "distributed"
        pa = tokenizer.encode("Kir Naibram was", add_special_tokens=False)
        pb = tokenizer.encode("Dodus is", add_special_tokens=False)
        assert_logprobs(
            tiny_model, [pa, pb], eng.generate([pa, pb], SamplingParams(max_new_tokens=6, seed=1))
        )
        assert eng.route([pa, pb]) == [0, 1]  # one prompt on each replica
        eng.in_flight = [0, 0]
        trained = build_model("tiny", tokenizer, seed=9)  # other weights, the same names and shapes
        for version in (2, 3):
            eng.push_weights(trained, version)
            out = eng.generate([pa, pb], SamplingParams(max_new_tokens=6, seed=version))
            assert eng.weights_version == version and {s.weights_version for s in out} == {version}
            assert_logprobs(trained, [pa, pb], out)
            with torch.no_grad():
                for p in trained.parameters():
                    p.mul_(0.5)
    finally:
        if eng is not None:
            eng.close()
        for server in servers:
            server.terminate()
            server.wait(timeout=10)


def wait_until_up(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/get_server_info", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise TimeoutError(f"the stand-in at {url} did not start")


def assert_logprobs(model, prompts, samples) -> None:
    for p, s in zip(prompts, samples, strict=True):
        ids = torch.tensor([p + s.token_ids])
        ref = token_logprobs(model, ids, torch.ones_like(ids))[0, len(p) - 1 :]
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not os.environ.get("SGLANG_URL"), reason="set SGLANG_URL to a running SGLang server")
def test_real_sglang_server():
    """Generate, then push the server's own model (read from its `model_path`, on this machine's GPU)
    by NCCL broadcast, and generate again from the pushed weights."""
    eng = SGLangEngine(os.environ["SGLANG_URL"])
    (s,) = eng.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8))
    assert len(s.token_ids) == len(s.logprobs) >= 1
    path = httpx.get(f"{os.environ['SGLANG_URL']}/get_server_info", timeout=10).json()["model_path"]
    pusher = SGLangEngine(os.environ["SGLANG_URL"], weight_sync="distributed", sync_host="127.0.0.1")
    pusher.push_weights(load(path)[0].to("cuda"), version=1)
    (again,) = pusher.generate([[1, 2, 3]], SamplingParams(max_new_tokens=8, temperature=0.0))
    assert again.weights_version == 1 and len(again.token_ids) >= 1
    pusher.close()
