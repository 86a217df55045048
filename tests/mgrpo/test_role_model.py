"""`RoleModel` with the real loading path (a saved HF folder as the role's `path`): the staleness
triage of an update and the weight push to an own-weights engine (max_staleness ≥ 1)."""

import pytest

from mgrpo.config import JobConfig
from mgrpo.engines.base import SamplingParams
from mgrpo.models import build_model, save
from mgrpo.records import Sample, Transcript
from mgrpo.role_model import RoleModel
from mgrpo.runtime import Placement
from mgrpo.workflows import job_spec


@pytest.fixture(scope="module")
def folder(tokenizer, tmp_path_factory):
    return save(build_model("tiny", tokenizer, seed=0), tokenizer, tmp_path_factory.mktemp("tiny") / "m")


def role_model(folder, tmp_path, **job):
    cfg = JobConfig(roles={"planner": {"model": {"path": str(folder)}}}, **job)
    placement = Placement(cache_dir=tmp_path, checkpoint_dir=tmp_path)
    return RoleModel(job_spec(cfg), "planner", placement=placement, job_id="j", last_step=-1)


def samples_of(m, versions):
    ids = m.tokenizer.encode("who was born in", add_special_tokens=False)
    out = []
    for i, v in enumerate(versions):
        (s,) = m.engine.generate([ids], SamplingParams(max_new_tokens=6, seed=i))
        tr = Transcript(
            ids + s.token_ids,
            [0.0] * len(ids) + s.logprobs,
            [0] * len(ids) + [1] * len(s.token_ids),
            len(ids),
        )
        out.append(
            Sample("planner", "g", tr, float(i % 2), advantage=1.0 if i % 2 else -1.0, policy_version=v)
        )
    return out


@pytest.mark.parametrize("policy", ["drop", "keep-with-correction"])
def test_stale_samples_beyond_the_bound(folder, tmp_path, policy):
    m = role_model(folder, tmp_path, max_staleness=1, stale_samples=policy)
    try:
        assert not m.engine.shares_weights and m.engine.weights_version == 0
        m.update(samples_of(m, [0, 0]), seed=0)
        m.update(samples_of(m, [1, 1]), seed=1)  # now at version 2
        metrics = m.update(samples_of(m, [2, 2, 1, 0]), seed=2)  # lags 0, 0, 1, 2 (bound 1)
        assert metrics["staleness_0"] == 0.5 and metrics["staleness_1"] == 0.25
        assert metrics["stale_beyond_bound"] == 1
        assert metrics["stale_dropped"] == (1 if policy == "drop" else 0)
        assert metrics["samples"] == (3 if policy == "drop" else 4)
        assert "is_weight_mean" in metrics and m.version == 3
        # the pushed weights reach the engine: the next request samples from version 3
        (s,) = m.engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))
        assert s.weights_version == 3
    finally:
        m.close()


def test_synchronous_role_shares_weights_and_trains_on_policy(folder, tmp_path):
    m = role_model(folder, tmp_path)
    try:
        assert m.engine.shares_weights
        metrics = m.update(samples_of(m, [0, 0]), seed=0)
        assert "is_weight_mean" not in metrics and metrics["staleness_0"] == 1.0
        assert m.engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=2))[0].weights_version == 1
    finally:
        m.close()
