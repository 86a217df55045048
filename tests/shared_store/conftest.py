from __future__ import annotations

import pytest

from shared_store import Store


@pytest.fixture
def store(redis_url: str) -> Store:
    return Store.connect(redis_url, wait_s=10)
