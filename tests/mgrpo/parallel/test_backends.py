"""The backend table (`mgrpo.parallel.backends`): what each backend declares is what the rank group, the
service settings and the CLI enforce."""

from __future__ import annotations

import pytest

from mgrpo.parallel.backends import BACKENDS, backend, pipelining
from mgrpo.parallel.ranks import RankGroup, policy_class
from services.settings import Settings


def test_an_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="unknown backend 'deepspeed': fsdp or megatron"):
        backend("deepspeed")
    with pytest.raises(ValueError, match="unknown backend"):
        RankGroup("deepspeed")


def test_each_backend_builds_its_own_policy_and_declares_its_checkpoints():
    assert {policy_class(name).__name__ for name in BACKENDS} == {"ShardedPolicy", "MegatronPolicy"}
    assert RankGroup("megatron", 2).stages == 2
    assert pipelining() == ["megatron"]
    assert [b.name for b in BACKENDS.values() if b.shards_optimizer] == ["fsdp"]
    assert [name for name in BACKENDS if RankGroup(name).trains_adapters] == ["fsdp"]


def test_pipeline_stages_need_a_backend_that_pipelines():
    with pytest.raises(ValueError, match="pipeline stages need a backend that pipelines"):
        RankGroup("fsdp", 2)
    with pytest.raises(ValueError, match="MGRPO_PIPELINE_STAGES > 1 needs MGRPO_BACKEND=megatron"):
        Settings(ranks=2, pipeline_stages=2)
    assert Settings(ranks=2, backend="megatron", pipeline_stages=2).pipeline_stages == 2


def test_a_backend_that_splits_the_model_needs_its_fewest_ranks():
    with pytest.raises(ValueError, match="MGRPO_RANKS \\(or MGRPO_NODES\\) of 2 or more"):
        Settings(backend="megatron")
    assert Settings(backend="fsdp").ranks == 1
