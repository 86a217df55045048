import json
import math
import os
import subprocess
import sys

import pytest

from mgrpo.tasks.deep_research import (
    STAGE2_KINDS,
    Corpus,
    DeepResearchTask,
    fact,
    gold_plan,
    load_documents,
    load_jsonl,
    majority_answers,
    make_questions,
)
from mgrpo.tasks.world import generate_world


@pytest.fixture(scope="module")
def task():
    return DeepResearchTask(generate_world(0, n_people=300))


def test_world_is_deterministic_per_seed():
    a, b, c = generate_world(3, n_people=50), generate_world(3, n_people=50), generate_world(4, n_people=50)
    assert a.people == b.people and a.docs == b.docs and a.heldout_people == b.heldout_people
    assert a.people != c.people


def test_split_by_entity(task):
    w = task.world
    assert not set(w.train_people) & set(w.heldout_people)
    assert len(w.train_people) + len(w.heldout_people) == len(w.people)
    for q in make_questions(w, "heldout", 2, 50) + make_questions(w, "heldout", 1, 30):
        assert set(q.entities) <= set(w.heldout_people)
        for sub, _ in gold_plan(w, q):
            assert not any(p in sub for p in w.train_people)
    for q in make_questions(w, "train", 2, 50):
        assert set(q.entities) <= set(w.train_people)


def test_questions_are_deterministic_and_staged(task):
    q1 = make_questions(task.world, "train", 2, 20, seed=1)
    assert q1 == make_questions(task.world, "train", 2, 20, seed=1)
    assert q1 != make_questions(task.world, "train", 2, 20, seed=2)
    assert {q.kind for q in q1} == set(STAGE2_KINDS)
    for q in q1:
        assert 2 <= len(gold_plan(task.world, q)) <= 4  # stage 2 needs 2-4 delegations
    for q in make_questions(task.world, "train", 1, 9):
        assert len(gold_plan(task.world, q)) == 1


def test_gold_plan_reaches_the_answer(task):
    w = task.world
    for q in make_questions(w, "train", 2, 30):
        plan = gold_plan(w, q)
        if q.kind in ("country", "org_city", "org_country"):
            assert plan[-1][1] == q.answer
        if q.kind == "earlier":
            (_, ya), (_, yb) = plan
            assert q.answer == (q.entities[0] if int(ya) < int(yb) else q.entities[1])


def test_retrieval_returns_the_gold_document(task):
    w = task.world
    for q in make_questions(w, "heldout", 2, 30):
        for sub, value in gold_plan(w, q):
            entity = sub.split(" of ", 1)[1]
            top = task.search(entity).splitlines()[0]
            doc_id, title = top.split(" ", 1)
            assert title == entity
            assert value in task.open(doc_id)
    assert task.search("qqqq zzzz") == "no results"
    assert task.open("d999999").startswith("no document")
    assert "unknown tool" in task.call_tool("fly", "x")


def test_judge_and_correct(task):
    p = task.world.people[task.world.train_people[0]]
    assert task.judge(f"birth city of {p.name}", f"It is {p.birth_city}.") == 1.0
    assert task.judge(f"birth year of {p.name}", "1000") == 0.0
    assert math.isnan(task.judge("favourite colour of nobody", "blue"))
    assert fact(task.world, "birth city of Nobody Known") is None
    assert task.correct("The Kruteth.", "kruteth") == 1.0


def test_majority_baseline(task):
    qs = make_questions(task.world, "train", 2, 100)
    maj = majority_answers(qs)
    assert maj["same_country"] in ("yes", "no") and set(maj) == set(STAGE2_KINDS)


def test_jsonl_dataset(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"query": "2+2?", "answer": "4", "metadata": {"stage": 1}}) + "\n\n")
    (q,) = load_jsonl(path)
    assert (q.text, q.answer, q.stage) == ("2+2?", "4", 1)
    path.write_text('{"query": "no answer"}\n')
    with pytest.raises(ValueError, match=r"row 1: field 'answer'"):
        load_jsonl(path)


def test_bad_arguments(task):
    with pytest.raises(ValueError, match="split"):
        make_questions(task.world, "test", 1, 1)
    with pytest.raises(ValueError, match="at least"):
        generate_world(0, n_people=3)


def test_a_corpus_of_your_documents(tmp_path):
    """`Corpus` over a documents file (what examples/tool_server.py serves): BM25 search lines and
    open by id; a bad line names its line number."""
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        '{"id": "a1", "title": "Mount Ovo", "text": "Mount Ovo is 3100 m high."}\n\n'
        '{"id": "b2", "title": "Lake Ith", "text": "Lake Ith is 40 m deep."}\n'
    )
    corpus = Corpus(load_documents(docs))
    assert corpus.search("how deep is lake ith").splitlines()[0] == "b2 Lake Ith"
    assert corpus.open(" a1 ") == "Mount Ovo is 3100 m high." and corpus.open("zz").startswith("no document")
    assert corpus.search("qqqq") == "no results"
    docs.write_text('{"id": "a1", "text": "x"}\n{"title": "no id"}\n')
    with pytest.raises(ValueError, match=r"docs.jsonl:2: .*'id' and 'text'"):
        load_documents(docs)


@pytest.mark.parametrize(("given", "want"), [(None, "cpu"), ("cuda", "cuda")])
def test_the_search_index_keeps_jax_off_the_gpu_unless_told(given, want):
    """bm25s runs a JAX op on import where JAX is installed, and JAX would take 75 % of the GPU from
    the trainer in the same process: building a search index keeps JAX on the CPU, unless the user
    chose; importing the task changes nothing."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"} | (
        {"JAX_PLATFORMS": given} if given else {}
    )
    code = (
        "import os; from mgrpo.tasks.deep_research import Corpus; from mgrpo.tasks.world import Doc;"
        "imported = os.environ.get('JAX_PLATFORMS'); Corpus([Doc('d1', 'Ada', 'Ada was born in 1900.')]);"
        "print(imported, os.environ.get('JAX_PLATFORMS'))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-2:] == [str(given), want]  # the import left it as it was
