import socket
import threading
import time

import pytest

from planner_trainer.delegate import CalleeClient, PartnerError, server_timing
from shared_store.embedded import free_port
from shared_store.jobs import JobCancelled


def test_server_timing_header():
    assert server_timing("episode;dur=12.5, store;dur=0.75") == {"episode": 12.5, "store": 0.75}
    assert server_timing("") == {}
    assert server_timing('cache;desc="hit", db;dur=x, app;dur=3') == {"app": 3.0}  # no dur / bad dur skipped


def test_the_jobs_end_ends_the_retries_against_a_partner_that_is_down():
    """Nothing listens on the port: the client retries until the job's timeout (30 s here), but once
    the job has ended it stops at its next retry; with no end it gives up at the timeout."""
    ended = threading.Event()
    ended.set()
    client = CalleeClient(f"http://127.0.0.1:{free_port()}", "", timeout_s=30, role="subagent", ended=ended)
    t0 = time.monotonic()
    with pytest.raises(JobCancelled):
        client.episode({"subtask": "find x"})
    assert time.monotonic() - t0 < 1.0
    never = CalleeClient(f"http://127.0.0.1:{free_port()}", "", timeout_s=0.5, role="subagent")
    with pytest.raises(PartnerError, match="did not answer within"):
        never.episode({"subtask": "find x"})


def test_the_jobs_end_abandons_a_call_a_stopped_partner_never_answers():
    """A partner that takes the connection and the request and never answers (a SIGSTOPped service:
    its kernel still accepts): the call in flight is given up within a second of the job's end, not
    at its 120 s timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    got_request, ended = threading.Event(), threading.Event()

    def take_and_hold():
        conn, _ = server.accept()
        conn.recv(65536)
        got_request.set()
        ended.wait(30)
        conn.close()

    threading.Thread(target=take_and_hold, daemon=True).start()
    client = CalleeClient(
        f"http://127.0.0.1:{server.getsockname()[1]}", "", timeout_s=120, role="subagent", ended=ended
    )
    threading.Thread(target=lambda: got_request.wait(30) and ended.set(), daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(JobCancelled):
            client.episode({"subtask": "find x"})
        assert got_request.is_set() and time.monotonic() - t0 < 5.0
    finally:
        client.close()
        server.close()


def test_the_wait_on_a_partners_ledger_ends_when_another_trainer_failed_the_job(redis_url):
    """A callee trainer that failed the job (a remote service, or one hosted in the root's trainer,
    `services.hosted`) ends the root's wait at once, not at the job's partner timeout."""
    from planner_trainer.partners import wait_applied
    from shared_store import Store

    store = Store.connect(redis_url)
    record, _ = store.jobs.create({"steps": 2}, None, roles=("planner",))
    store.jobs.transition(record.job_id, "running")
    store.jobs.transition(record.job_id, "failed", "subagent trainer: boom")
    with pytest.raises(JobCancelled):  # before: waited out the 30 s, then PartnerError
        wait_applied(store, record.job_id, ("subagent",), 0, timeout_s=30)
