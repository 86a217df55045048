"""The fixtures of the end-to-end modules (module-scoped: each module starts its own cluster)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mgrpo.workflows.deep_research_warmstart import WarmstartResult
from services.launcher import LocalCluster
from shared_store import Store
from tests.services.e2e import default_warm_start, e2e_cluster


@pytest.fixture(scope="module")
def warm() -> WarmstartResult:
    return default_warm_start()


@pytest.fixture(scope="module")
def cluster(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, warm: WarmstartResult
) -> Iterator[LocalCluster]:
    with e2e_cluster(redis_url, tmp_path_factory) as c:
        yield c


@pytest.fixture(scope="module")
def store(redis_url: str) -> Store:
    return Store.connect(redis_url)
