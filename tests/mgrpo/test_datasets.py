"""User datasets: every row validated (the first bad row and field named), JSONL and Parquet read the
same, one canonical form and one id for the same rows, per-step sampling that covers the train split."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mgrpo.datasets import DatasetError, canonical, check_splits, dataset_id, parse, read_uri, splits
from mgrpo.tasks.deep_research import dataset_questions, epoch_sample


def jsonl(*rows: object) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


ROWS = [
    {"query": "Where was Kir born?", "answer": "Lotham", "split": "train"},
    {"prompt": "2 + 2?", "answer": "4", "metadata": {"kind": "math"}},  # `prompt`: the other common name
    {"query": "Who employs Ana?", "answer": "Velo", "split": "test", "id": "a-7"},
]


def test_rows_are_parsed_with_defaults():
    rows = parse(jsonl(*ROWS) + b"\n\n")
    assert [r.query for r in rows] == ["Where was Kir born?", "2 + 2?", "Who employs Ana?"]
    assert [r.split for r in rows] == ["train", "train", "test"]
    assert rows[1].metadata == {"kind": "math"} and rows[2].id == "a-7"
    assert splits(rows) == {"test": 1, "train": 2}
    qs = dataset_questions(rows, "test")
    assert [(q.qid, q.text, q.answer) for q in qs] == [("a-7", "Who employs Ana?", "Velo")]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (jsonl(ROWS[0], {"query": "no answer"}, ROWS[2]), r"row 2: field 'answer': Field required"),
        (jsonl(ROWS[0], ROWS[1], {"query": "q", "answer": 4}), r"row 3: field 'answer'"),
        (jsonl(ROWS[0], {"query": "  ", "answer": "x"}), r"row 2: field 'query'.*blank"),
        (jsonl(ROWS[0], {"query": "q", "answer": "a", "extra": 1}), r"row 2: field 'extra'"),
        (jsonl(ROWS[0], {"query": "q", "answer": "a", "split": "a b"}), r"row 2: field 'split'"),
        (jsonl(ROWS[0]) + b"\n{not json", r"row 2: not valid JSON"),
        (jsonl(ROWS[0]) + b"\n[1, 2]", r"row 2: expected a JSON object"),
        (b"", r"empty"),
        (b"\n \n", r"empty"),
        (b"\x00\x9f\x92\x96binary", r"neither UTF-8 JSONL nor Parquet"),
        (b"PAR1 not really parquet", r"cannot be read"),
    ],
)
def test_bad_files_name_the_problem(data, message):
    with pytest.raises(DatasetError, match=message):
        parse(data)


def test_parquet_reads_like_jsonl():
    table = pa.Table.from_pylist(
        [
            {
                "query": r.get("query", r.get("prompt")),
                "answer": r["answer"],
                "split": r.get("split", "train"),
            }
            for r in ROWS
        ]
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    assert dataset_id(parse(buf.getvalue())) == dataset_id(
        parse(
            jsonl(
                *[
                    {**r, "metadata": {}}
                    for r in [
                        {"query": "Where was Kir born?", "answer": "Lotham"},
                        {"query": "2 + 2?", "answer": "4"},
                        {"query": "Who employs Ana?", "answer": "Velo", "split": "test"},
                    ]
                ]
            )
        )
    )


def test_the_id_is_the_content():
    a = parse(jsonl(*ROWS))
    b = parse(jsonl(*[{k: r[k] for k in sorted(r, reverse=True)} for r in ROWS]))  # other key order
    assert dataset_id(a) == dataset_id(b) and canonical(a) == canonical(b)
    assert parse(canonical(a)) == a  # the stored form reads back to the same rows
    changed = parse(jsonl(ROWS[0], ROWS[1], {**ROWS[2], "answer": "Velox"}))
    assert dataset_id(changed) != dataset_id(a)


def test_missing_splits_and_uris(tmp_path):
    rows = parse(jsonl(*ROWS))
    check_splits(rows, "train", "test")
    check_splits(rows, "train", None)
    with pytest.raises(
        DatasetError, match=r"dataset.eval_split: the dataset has no split 'heldout'.*train \(2 rows\)"
    ):
        check_splits(rows, "train", "heldout")
    with pytest.raises(DatasetError, match=r"dataset.train_split"):
        check_splits(rows, "dev", None)
    path = tmp_path / "d.jsonl"
    path.write_bytes(jsonl(*ROWS))
    assert read_uri(f"file://{path}") == rows
    with pytest.raises(DatasetError, match="no such file"):
        read_uri(f"file://{tmp_path}/nope.jsonl")


def test_epoch_sampling_covers_the_pool_once_per_epoch():
    pool = dataset_questions(parse(jsonl(*[{"query": f"q{i}", "answer": "a"} for i in range(10)])), None)
    taken = [q.text for step in range(5) for q in epoch_sample(pool, step, 4, seed="0:0")]  # 2 epochs
    assert sorted(taken[:10]) == sorted(q.text for q in pool) == sorted(taken[10:20])
    assert taken[:10] != taken[10:20]  # each epoch in its own order
    assert epoch_sample(pool, 3, 4, seed="0:0") == epoch_sample(pool, 3, 4, seed="0:0")
    assert epoch_sample(pool, 0, 4, seed="0:1") != epoch_sample(pool, 0, 4, seed="0:0")


def test_deeply_nested_metadata_is_a_clear_error_not_a_crash():
    """A row whose metadata nests 5,000 levels (Python's JSON reader would recurse too deep) or just
    past the bound is refused naming the row; the bound itself is taken."""
    from mgrpo.datasets import MAX_METADATA_DEPTH

    def row(depth):
        return (
            '{"query": "q", "answer": "a", "metadata": ' + '{"a": ' * depth + "1" + "}" * depth + "}"
        ).encode()

    for depth, says in ((5000, "nests too deeply"), (MAX_METADATA_DEPTH + 1, "flatten it")):
        with pytest.raises(DatasetError, match=f"row 1: .*{says}"):
            parse(row(depth))
    assert parse(row(MAX_METADATA_DEPTH))[0].metadata
