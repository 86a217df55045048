import threading
import time

import pytest
import torch

from mgrpo.engines.base import SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.models import token_logprobs


@pytest.fixture(params=[True, False], ids=["static", "dynamic"])
def static_cache(request):
    """Every engine test runs on both decoders (`mgrpo.engines.decoders`)."""
    return request.param


@pytest.fixture
def engine(tiny_model, tokenizer, static_cache):
    eng = HFEngine(tiny_model, tokenizer, gather_ms=20, static_cache=static_cache)
    yield eng
    eng.close()


def prompts(small_task, tokenizer, n):
    return [
        tokenizer.encode(d.text, add_special_tokens=False)[: 6 + i % 9]
        for i, d in enumerate(small_task.world.docs[:n])
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_teacher_forced_forward(engine, tiny_model, small_task, tokenizer, temperature):
    """Tolerance 1e-4: KV-cached batched decoding vs one full forward pass, fp32."""
    ps = prompts(small_task, tokenizer, 8)
    out = engine.generate(ps, SamplingParams(max_new_tokens=20, temperature=temperature, seed=1))
    for p, s in zip(ps, out, strict=True):
        ids = torch.tensor([p + s.token_ids])
        ref = token_logprobs(tiny_model, ids, torch.ones_like(ids), temperature=temperature)[0, len(p) - 1 :]
        assert len(s.logprobs) == len(s.token_ids) == ref.numel()
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4)


def test_64_concurrent_requests_share_forward_passes(engine, small_task, tokenizer):
    ps = prompts(small_task, tokenizer, 64)
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    barrier = threading.Barrier(64)
    results = [None] * 64

    def call(i):
        barrier.wait()
        results[i] = engine.generate([ps[i]], params)[0]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r is not None and len(r.token_ids) >= 1 for r in results)
    # one-by-one would need 64 × up to 16 passes; batched, a few batches of ≤ 16 passes each
    assert engine.forward_passes <= 4 * 16, engine.forward_passes
    assert engine.prefills <= 4


def test_seed_reproducible_and_greedy_deterministic(engine, small_task, tokenizer):
    (p,) = prompts(small_task, tokenizer, 1)
    a = engine.generate([p], SamplingParams(max_new_tokens=12, seed=7))[0]
    b = engine.generate([p], SamplingParams(max_new_tokens=12, seed=7))[0]
    assert a.token_ids == b.token_ids
    g1 = engine.generate([p, p], SamplingParams(max_new_tokens=12, temperature=0))
    assert g1[0].token_ids == g1[1].token_ids


def test_stop_token_ends_generation(engine, small_task, tokenizer):
    (p,) = prompts(small_task, tokenizer, 1)
    free = engine.generate([p], SamplingParams(max_new_tokens=12, temperature=0))[0]
    stop_at = free.token_ids[3]
    s = engine.generate([p], SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(stop_at,)))[0]
    assert s.finish_reason == "stop" and s.token_ids[-1] == stop_at
    assert s.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]
    assert free.finish_reason in ("length", "eos")


def test_top_p_keeps_only_the_nucleus(engine, small_task, tokenizer):
    (p,) = prompts(small_task, tokenizer, 1)
    greedy = engine.generate([p], SamplingParams(max_new_tokens=1, temperature=0))[0].token_ids[0]
    tiny_nucleus = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=1e-6)
    assert all(engine.generate([p], tiny_nucleus)[0].token_ids[0] == greedy for _ in range(5))


def test_update_weights_from_checkpoint(engine, tiny_model, tokenizer, tmp_path):
    from mgrpo.models import build_model, save

    other = build_model("tiny", tokenizer, seed=123)
    save(other, tokenizer, tmp_path / "v2")
    before = [p.clone() for p in tiny_model.parameters()]
    try:
        engine.update_weights(str(tmp_path / "v2"))
        assert all(
            torch.equal(a, b) for a, b in zip(tiny_model.parameters(), other.parameters(), strict=True)
        )
    finally:
        with torch.no_grad():
            for p, b in zip(tiny_model.parameters(), before, strict=True):
                p.copy_(b)
    with pytest.raises(ValueError, match="safetensors"):
        engine.update_weights(str(tmp_path))


def test_bad_params():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)


def _wait_for_passes(engine, n, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while engine.forward_passes < n:
        assert time.monotonic() < deadline, "the engine did not step"
        time.sleep(0.001)


def _teacher_forced(model, prompt, sample, temperature):
    ids = torch.tensor([prompt + sample.token_ids])
    t = temperature if temperature > 0 else 1.0
    return token_logprobs(model, ids, torch.ones_like(ids), temperature=t)[0, len(prompt) - 1 :]


def test_requests_join_a_running_batch_with_exact_logprobs(tiny_model, small_task, tokenizer, static_cache):
    """Continuous batching: requests that arrive mid-decode (prompts shorter and longer than the running
    cache, other temperatures) join between steps; every row's log-probs still equal a teacher-forced
    forward pass, and a short late request finishes before the long early one."""
    eng = HFEngine(tiny_model, tokenizer, gather_ms=0, static_cache=static_cache)
    eng.eos_id = None  # every request runs to its max_new_tokens
    try:
        long_p, short_p, longer_p = prompts(small_task, tokenizer, 3)[0], [5, 6], list(range(5, 45))
        first = eng.submit(long_p, SamplingParams(max_new_tokens=60, temperature=1.0, seed=3))
        _wait_for_passes(eng, 5)
        late = [
            (short_p, 0.7, eng.submit(short_p, SamplingParams(max_new_tokens=4, temperature=0.7, seed=4))),
            (longer_p, 0.0, eng.submit(longer_p, SamplingParams(max_new_tokens=8, temperature=0))),
        ]
        done_late = [f.result(timeout=30) for _, _, f in late]
        assert not first.done(), "a late short request waited for the running one to finish"
        results = [(long_p, 1.0, first.result(timeout=30))] + [
            (p, t, s) for (p, t, _), s in zip(late, done_late, strict=True)
        ]
        for p, t, s in results:
            ref = _teacher_forced(tiny_model, p, s, t)
            assert len(s.token_ids) == ref.numel()
            assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4), (p, t)
        assert eng.prefills >= 2  # the late ones were admitted into the running batch, not after it
        assert len(results[0][2].token_ids) == 60 and results[0][2].finish_reason == "length"
    finally:
        eng.close()


def test_paused_lets_running_rows_finish_then_holds_new_ones(tiny_model, small_task, tokenizer, static_cache):
    eng = HFEngine(tiny_model, tokenizer, gather_ms=0, static_cache=static_cache)
    eng.eos_id = None
    try:
        (p,) = prompts(small_task, tokenizer, 1)
        running = eng.submit(p, SamplingParams(max_new_tokens=30, seed=1))
        _wait_for_passes(eng, 2)
        with eng.paused():
            assert running.done()  # the trainer got in only once the running row was done
            queued = eng.submit(p, SamplingParams(max_new_tokens=3, seed=1))
            passes = eng.forward_passes
            time.sleep(0.05)
            assert not queued.done() and eng.forward_passes == passes
        assert queued.result(timeout=30).token_ids == running.result().token_ids[:3]  # same seed, same draws
    finally:
        eng.close()


def test_own_weights_swap_between_steps(tiny_model, small_task, tokenizer, static_cache):
    """A request running when new weights are pushed finishes on the old weights (its log-probs equal a
    teacher-forced pass of the old model); one submitted after the push samples from the new ones. The
    trainer's model changes in place meanwhile without pausing the engine."""
    import copy

    old, trainer = tiny_model, copy.deepcopy(tiny_model)
    eng = HFEngine(trainer, tokenizer, gather_ms=0, own_weights=True, version=3, static_cache=static_cache)
    eng.eos_id = None
    try:
        (p,) = prompts(small_task, tokenizer, 1)
        running = eng.submit(p, SamplingParams(max_new_tokens=40, seed=1))
        _wait_for_passes(eng, 2)
        with torch.no_grad():  # the "update": every weight moves, the engine is not paused
            for w in trainer.parameters():
                w.add_(0.05 * torch.randn_like(w))
        eng.push_weights(trainer, 4)
        after = eng.submit(p, SamplingParams(max_new_tokens=12, seed=2))
        a, b = running.result(timeout=30), after.result(timeout=30)
        assert (a.weights_version, b.weights_version) == (3, 4) and eng.swaps == 1
        assert len(a.token_ids) == 40  # it was still decoding when the push arrived
        assert torch.allclose(torch.tensor(a.logprobs), _teacher_forced(old, p, a, 1.0), atol=1e-4)
        assert torch.allclose(torch.tensor(b.logprobs), _teacher_forced(trainer.eval(), p, b, 1.0), atol=1e-4)
        assert not torch.allclose(
            _teacher_forced(old, p, b, 1.0), _teacher_forced(trainer, p, b, 1.0), atol=1e-3
        )
        with eng.paused():  # an own-weights engine never holds generation
            assert eng.generate([p], SamplingParams(max_new_tokens=3, seed=1))[0].weights_version == 4
    finally:
        eng.close()
