import time

import pytest

from planner_trainer.delegate import CalleeClient, PartnerError, server_timing
from shared_store.embedded import free_port
from shared_store.jobs import JobCancelled


def test_server_timing_header():
    assert server_timing("episode;dur=12.5, store;dur=0.75") == {"episode": 12.5, "store": 0.75}
    assert server_timing("") == {}
    assert server_timing('cache;desc="hit", db;dur=x, app;dur=3') == {"app": 3.0}  # no dur / bad dur skipped


def test_a_cancel_ends_the_retries_against_a_partner_that_is_down():
    """Nothing listens on the port: the client retries until the job's timeout (30 s here), but a
    cancel ends the wait within a second."""
    t0 = time.monotonic()
    client = CalleeClient(
        f"http://127.0.0.1:{free_port()}",
        "",
        timeout_s=30,
        role="subagent",
        cancelled=lambda: time.monotonic() - t0 > 0.3,
    )
    with pytest.raises(JobCancelled):
        client.episode({"subtask": "find x"})
    assert time.monotonic() - t0 < 1.5
    never = CalleeClient(
        f"http://127.0.0.1:{free_port()}", "", timeout_s=0.5, role="subagent", cancelled=lambda: False
    )
    with pytest.raises(PartnerError, match="did not answer within"):
        never.episode({"subtask": "find x"})
