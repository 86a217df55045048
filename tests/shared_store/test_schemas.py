import json

import numpy as np
import pytest

from shared_store import EpisodeArrays
from shared_store.codec import decode_arrays, pack_episode, unpack_episode
from shared_store.keys import episode_id
from shared_store.schemas import (
    EpisodeGroup,
    EpisodeMeta,
    JobDispatch,
    JobRecord,
    LedgerEntry,
    MetricsEvent,
    PayloadError,
    PlannerStepStats,
    PolicyVersion,
    QueryStats,
    RoleBatch,
    RolloutStat,
    SchemaVersionError,
    ScoredEpisode,
    decode,
    encode,
)

J = "job-a"
MESSAGES = [
    JobRecord(
        job_id=J,
        status="queued",
        config={"k": 8},
        created_at=1.0,
        updated_at=2.0,
        roles=["solver", "verifier"],
    ),
    JobDispatch(job_id=J, roles=["planner", "subagent"]),
    PlannerStepStats(
        job_id=J,
        step=3,
        policy_version=3,
        queries=[
            QueryStats(
                query_id="q1",
                reward_mean=0.5,
                reward_std=0.1,
                rollouts=[
                    RolloutStat(
                        rollout=0,
                        reward=1.0,
                        correct=1.0,
                        format_ok=True,
                        episodes={"subagent": ["s3-q1-r0-c0"]},
                    )
                ],
            )
        ],
    ),
    RoleBatch(
        job_id=J,
        step=3,
        policy_version=2,
        role="verifier",
        groups=[
            EpisodeGroup(group="t1.V1.0", episodes=[ScoredEpisode(episode_id="s3-t1.V1.0-r0-c0", reward=1.0)])
        ],
    ),
    EpisodeMeta(
        job_id=J,
        step=3,
        policy_version=2,
        episode_id="s3-q1-r0-c0",
        query_id="q1",
        rollout=0,
        call=0,
        n_tokens=5,
        expert_score=0.5,
        subtask="find X",
        result="Y",
    ),
    PolicyVersion(job_id=J, role="planner", version=4, step=3, checkpoint="/ckpt/4"),
    MetricsEvent(job_id=J, step=3, role="planner", values={"planner/reward_mean": 0.4}),
    LedgerEntry(job_id=J, role="subagent", step=3, policy_version=3, consumer="c1"),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg):
    back = decode(type(msg), encode(msg))
    assert back == msg
    assert back.idempotency_key  # filled from the message's identity


def test_idempotency_key_is_stable_per_identity():
    a = PolicyVersion(job_id=J, role="planner", version=4, step=3, published_at=1.0)
    b = PolicyVersion(job_id=J, role="planner", version=4, step=3, published_at=2.0)
    assert a.idempotency_key == b.idempotency_key == f"policy:{J}:planner:4"


def test_newer_schema_version_is_rejected_loudly():
    raw = json.loads(encode(MESSAGES[1]))
    raw["schema_version"] = 2
    with pytest.raises(SchemaVersionError, match="schema_version 2 is not supported"):
        decode(JobDispatch, json.dumps(raw))
    del raw["schema_version"]
    with pytest.raises(SchemaVersionError):
        decode(JobDispatch, json.dumps(raw))


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[1, 2]", b'{"schema_version": 1, "job_id": "x", "role": "Boss!"}']
)
def test_corrupted_payload_is_a_clear_error(raw):
    with pytest.raises(PayloadError, match="JobDispatch"):
        decode(JobDispatch, raw)


def test_unknown_fields_are_rejected():
    raw = json.loads(encode(MESSAGES[1]))
    raw["surprise"] = 1
    with pytest.raises(PayloadError, match="surprise"):
        decode(JobDispatch, json.dumps(raw))


def test_role_names_are_checked():
    with pytest.raises(PayloadError, match="role"):
        decode(JobDispatch, json.dumps({"schema_version": 1, "job_id": J, "roles": ["Bad Role"]}))
    assert JobDispatch(job_id=J, roles=["corrector"]).roles == ["corrector"]  # any workflow's role name


def test_episode_id_and_id_validation():
    assert episode_id(3, "q-7", 1, 2) == "s3-q-7-r1-c2"
    with pytest.raises(ValueError, match="invalid"):
        episode_id(3, "bad id/with:colon", 0, 0)


def test_arrays_round_trip_bit_identical():
    rng = np.random.default_rng(0)
    arr = EpisodeArrays.of(rng.integers(0, 2**31 - 1, 300), rng.standard_normal(300), rng.integers(0, 2, 300))
    arr = EpisodeArrays.of(
        arr.token_ids, np.append(arr.logp[:-2], [np.float32(-np.inf), np.float32(np.nan)]), arr.loss_mask
    )
    meta_json, body = unpack_episode(pack_episode(b'{"m": 1}', arr), "ep")
    assert bytes(meta_json) == b'{"m": 1}'
    back = decode_arrays(body, len(arr), arr.checksum(), "ep")
    for name in ("token_ids", "logp", "loss_mask"):
        assert getattr(back, name).tobytes() == getattr(arr, name).tobytes()
        assert getattr(back, name).dtype == getattr(arr, name).dtype


def test_corrupted_arrays_are_detected():
    arr = EpisodeArrays.of([1, 2, 3], [0.1, 0.2, 0.3], [0, 1, 1])
    _, body = unpack_episode(pack_episode(b"{}", arr), "ep")
    flipped = bytes([body[0] ^ 1]) + bytes(body[1:])
    with pytest.raises(PayloadError, match="checksum"):
        decode_arrays(flipped, 3, arr.checksum(), "ep")
    with pytest.raises(PayloadError, match="bytes"):
        decode_arrays(body[:-1], 3, arr.checksum(), "ep")
    with pytest.raises(PayloadError, match="not an episode"):
        unpack_episode(b"XXXX\x00\x00\x00\x00", "ep")
    with pytest.raises(PayloadError, match="too short"):
        unpack_episode(b"MG", "ep")
    with pytest.raises(ValueError, match="one length"):
        EpisodeArrays.of([1, 2], [0.1], [1, 1])
