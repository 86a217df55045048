import pytest

from shared_store import keys


def test_job_keys_share_one_hash_tag():
    ks = [
        keys.job("j1"),
        keys.stream("j1", "events"),
        keys.step_episodes("j1", 0),
        keys.ledger("j1"),
        keys.policy("j1"),
        keys.step_record("j1", "batch.verifier", 3),
        keys.checkpoints("j1"),
        keys.dead_letter(keys.stream("j1", "events")),
        keys.dispatch_lock("j1"),
    ]
    for k in ks:
        assert k.startswith("mgrpo:v1:{j1}:")


def test_bad_ids_and_names_are_refused():
    with pytest.raises(ValueError, match="job id"):
        keys.job("a}b")
    with pytest.raises(ValueError, match="stream"):
        keys.stream("j", "nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="stream"):
        keys.stream("j", "batch")
    with pytest.raises(ValueError, match="role"):
        keys.batch_stream("../x")
    assert keys.dispatch().endswith(":dispatch")  # one stream: every role meets the jobs in one order


@pytest.mark.parametrize("bad", ["", ".", "..", "...", "a/b", "x" * 129])
def test_ids_that_would_escape_a_folder_are_refused(bad):
    with pytest.raises(ValueError, match="invalid"):
        keys.check_id("job id", bad)
    assert keys.check_id("job id", "a..b") == "a..b"
