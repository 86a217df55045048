import numpy as np
import pytest

from shared_store import EpisodeArrays
from shared_store.episodes import EpisodeNotFoundError
from shared_store.keys import episode_id
from shared_store.schemas import EpisodeMeta, PayloadError

pytestmark = pytest.mark.redis


def write(store, job_id, step, n=3, tokens=50, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for call in range(n):
        eid = episode_id(step, "q0", 0, call)
        arr = EpisodeArrays.of(
            rng.integers(0, 50_000, tokens), rng.standard_normal(tokens), rng.integers(0, 2, tokens)
        )
        meta = EpisodeMeta(
            job_id=job_id,
            step=step,
            policy_version=1,
            episode_id=eid,
            query_id="q0",
            rollout=0,
            call=call,
            n_tokens=0,
            subtask="who",
            result="x",
        )
        out.append((store.episodes.put(meta, arr), arr))
    return out


def test_round_trip_bit_identical_with_duplicates_in_order(store, job_id):
    written = write(store, job_id, 0)
    ids = [written[2][0].episode_id, written[0][0].episode_id, written[2][0].episode_id]
    got = store.episodes.get_many(job_id, 0, ids)
    assert [m.episode_id for m, _ in got] == ids
    for (meta, arr), (wmeta, warr) in zip(got, [written[2], written[0], written[2]], strict=True):
        assert meta == wmeta and meta.n_tokens == 50
        assert arr.token_ids.tobytes() == warr.token_ids.tobytes()
        assert arr.logp.tobytes() == warr.logp.tobytes()
        assert arr.loss_mask.tobytes() == warr.loss_mask.tobytes()


def test_missing_and_corrupted(store, job_id):
    (meta, _), *_ = write(store, job_id, 0, n=1)
    with pytest.raises(EpisodeNotFoundError, match="nope"):
        store.episodes.get_many(job_id, 0, [meta.episode_id, "nope"])
    from shared_store import keys

    key, field = keys.step_episodes(job_id, 0), meta.episode_id
    blob = store.client.hget(key, field)
    store.client.hset(key, field, blob[:-60] + bytes([blob[-60] ^ 0xFF]) + blob[-59:])  # flip one byte
    with pytest.raises(PayloadError, match="checksum"):
        store.episodes.get_many(job_id, 0, [meta.episode_id])
    store.client.hset(key, field, blob[:-10])
    with pytest.raises(PayloadError, match="bytes"):
        store.episodes.get_many(job_id, 0, [meta.episode_id])
    store.client.hset(key, field, b"something else entirely")
    with pytest.raises(PayloadError, match="not an episode"):
        store.episodes.get_many(job_id, 0, [meta.episode_id])


def test_delete_step(store, job_id):
    write(store, job_id, 0)
    write(store, job_id, 1)
    assert len(store.episodes.step_ids(job_id, 0)) == 3
    assert store.episodes.delete_step(job_id, 0) == 3
    assert store.episodes.step_ids(job_id, 0) == [] and len(store.episodes.step_ids(job_id, 1)) == 3


def test_an_episode_id_is_written_once(store, job_id):
    first = EpisodeArrays.of(np.arange(5), np.zeros(5), np.ones(5))
    meta = EpisodeMeta(
        job_id=job_id,
        step=2,
        policy_version=1,
        episode_id=episode_id(2, "g", 0, 0),
        query_id="g",
        rollout=0,
        call=0,
        n_tokens=0,
        result="first",
    )
    written, created = store.episodes.put_once(meta, first)
    assert created and written.result == "first"
    again, created = store.episodes.put_once(
        meta.model_copy(update={"result": "second"}), EpisodeArrays.of(np.arange(9), np.zeros(9), np.ones(9))
    )
    assert not created and again.result == "first" and again.n_tokens == 5  # the replay gets the recorded one
    ((got_meta, got_arr),) = store.episodes.get_many(job_id, 2, [meta.episode_id])
    assert got_meta.result == "first" and got_arr.token_ids.tolist() == list(range(5))
    assert store.episodes.get_one(job_id, 2, "s2-none-r0-c0") is None
