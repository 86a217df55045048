"""The built-in task, "synthetic deep research": questions about a generated world, answered by a
planner that delegates one-fact subtasks to a sub-agent with a real retrieval tool (BM25, `bm25s`).

Subtask language (what the planner writes inside `<delegate>`), one fact each:
    birth city of <person> | birth year of <person> | employer of <person> | country of <city> | base of <org>

Questions: stage 1 asks for one fact (1 delegation); stage 2 is multi-hop or comparison (2-4
delegations, later subtasks naming facts returned by earlier ones). Answers are exact match after
normalisation. The expert judge scores a sub-agent result 1 when it contains the fact its subtask
asked for, 0 when not, NaN when the subtask is not in the language above (unscorable).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mgrpo.algo.rewards import normalize_answer
from mgrpo.datasets import Row, parse
from mgrpo.tasks.world import Doc, World, generate_world

STAGE1_KINDS = ("city", "year", "employer")
STAGE2_KINDS = ("country", "org_city", "org_country", "earlier", "same_country")
_SUBTASK = re.compile(r"^\s*(birth city|birth year|employer|country|base) of (.+?)\s*$")
# The team variant's comparison subtasks (its `comparer` role): "born first: A 1971, B 1968" → the
# name born first; "same: Naru, Veld" → yes / no.
COMPARISON = re.compile(r"^\s*(born first|same): (.+?), (.+?)\s*$")


@dataclass(frozen=True)
class Question:
    qid: str
    text: str
    answer: str
    stage: int
    kind: str
    entities: tuple[str, ...] = ()
    split: str = "custom"


def comparison_fact(subtask: str) -> str | None:
    """The gold answer of a comparison subtask, or None when it is not one (or a year is missing)."""
    m = COMPARISON.match(subtask)
    if m is None:
        return None
    if m.group(1) == "same":
        return "yes" if normalize_answer(m.group(2)) == normalize_answer(m.group(3)) else "no"
    (a, _, ya), (b, _, yb) = m.group(2).rpartition(" "), m.group(3).rpartition(" ")
    if not (ya.isdigit() and yb.isdigit()) or ya == yb:
        return None
    return a if int(ya) < int(yb) else b


def compare(argument: str) -> str:
    """The comparer's tool: `compare 1971 1968` → '1971 > 1968'; `compare Naru Veld` → 'different'."""
    a, _, b = argument.strip().partition(" ")
    if not b:
        return "compare needs two values"
    if a.isdigit() and b.strip().isdigit():
        x, y = int(a), int(b)
        return f"{x} {'<' if x < y else '>' if x > y else '='} {y}"
    return "same" if normalize_answer(a) == normalize_answer(b) else "different"


def fact(world: World, subtask: str) -> str | None:
    """The gold answer of a subtask (a lookup or, for the team variant, a comparison), or None when it
    is not in the subtask language / world."""
    if COMPARISON.match(subtask):
        return comparison_fact(subtask)
    m = _SUBTASK.match(subtask)
    if not m:
        return None
    rel, ent = m.group(1), m.group(2)
    if rel in ("birth city", "birth year", "employer"):
        p = world.people.get(ent)
        if p is None:
            return None
        return {"birth city": p.birth_city, "birth year": str(p.birth_year), "employer": p.employer}[rel]
    if rel == "country":
        c = world.cities.get(ent)
        return c.country if c else None
    o = world.orgs.get(ent)
    return o.base if o else None


def gold_plan(
    world: World, q: Question, *, told: Callable[[str], str | None] | None = None
) -> list[tuple[str, str]]:
    """The demonstration plan of a built-in question: (subtask, its fact) in delegation order.
    `told`: what a flawed demonstrator is told instead of a subtask's fact (None: the fact); the plan
    goes on from it (`plan_answer` then gives the answer it leads to)."""
    steps: list[tuple[str, str]] = []

    def ask(subtask: str) -> str:
        value = (told(subtask) if told else None) or fact(world, subtask)
        if value is None:
            raise ValueError(f"no fact for subtask {subtask!r}")
        steps.append((subtask, value))
        return value

    a = q.entities[0]
    if q.kind in ("city", "country", "same_country"):
        city = ask(f"birth city of {a}")
        if q.kind == "same_country":
            city_b = ask(f"birth city of {q.entities[1]}")
            ask(f"country of {city}")
            ask(f"country of {city_b}")
        elif q.kind == "country":
            ask(f"country of {city}")
    elif q.kind == "year":
        ask(f"birth year of {a}")
    elif q.kind == "earlier":
        ask(f"birth year of {a}")
        ask(f"birth year of {q.entities[1]}")
    else:  # employer, org_city, org_country
        org = ask(f"employer of {a}")
        if q.kind != "employer":
            base = ask(f"base of {org}")
            if q.kind == "org_country":
                ask(f"country of {base}")
    return steps


def plan_answer(q: Question, steps: Sequence[tuple[str, str]]) -> str:
    """The answer a `gold_plan`'s values lead to (the question's answer when they are the facts)."""
    v = [value for _, value in steps]
    if q.kind == "same_country":
        return "yes" if v[2] == v[3] else "no"
    if q.kind == "earlier":
        return q.entities[0] if int(v[0]) < int(v[1]) else q.entities[1]
    return v[-1]


def team_plan(world: World, q: Question) -> list[tuple[str, str]]:
    """The team variant's plan: the lookups of `gold_plan`, then, for a comparison question, one
    comparison subtask (answered by the comparer role) whose result is the answer."""
    steps = gold_plan(world, q)
    facts = [v for _, v in steps]
    if q.kind == "earlier":
        sub = f"born first: {q.entities[0]} {facts[0]}, {q.entities[1]} {facts[1]}"
    elif q.kind == "same_country":
        sub = f"same: {facts[2]}, {facts[3]}"
    else:
        return steps
    return [*steps, (sub, str(comparison_fact(sub)))]


def team_role(subtask: str) -> str:
    """Which sub-agent of the team variant a subtask goes to."""
    return "comparer" if COMPARISON.match(subtask) else "searcher"


def _question(world: World, kind: str, a: str, b: str, split: str, qid: str) -> Question:
    pa, pb = world.people[a], world.people[b]
    same = world.cities[pa.birth_city].country == world.cities[pb.birth_city].country
    text, answer = {
        "city": (f"Where was {a} born?", pa.birth_city),
        "year": (f"When was {a} born?", str(pa.birth_year)),
        "employer": (f"Who employs {a}?", pa.employer),
        "country": (f"In which country was {a} born?", world.cities[pa.birth_city].country),
        "org_city": (f"Where is the employer of {a} based?", world.orgs[pa.employer].base),
        "org_country": (
            f"In which country is the employer of {a} based?",
            world.cities[world.orgs[pa.employer].base].country,
        ),
        "earlier": (f"Who was born first, {a} or {b}?", a if pa.birth_year < pb.birth_year else b),
        "same_country": (f"Were {a} and {b} born in the same country?", "yes" if same else "no"),
    }[kind]
    entities = (a, b) if kind in ("earlier", "same_country") else (a,)
    return Question(qid, text, answer, 1 if kind in STAGE1_KINDS else 2, kind, entities, split)


def _same_country(world: World, a: str, b: str) -> bool:
    ca, cb = world.cities[world.people[a].birth_city], world.cities[world.people[b].birth_city]
    return ca.country == cb.country


def make_questions(world: World, split: str, stage: int, n: int, *, seed: int = 0) -> list[Question]:
    """`n` questions of one stage whose people all come from `split` ("train" or "heldout")."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    people = world.train_people if split == "train" else world.heldout_people
    kinds = STAGE1_KINDS if stage == 1 else STAGE2_KINDS
    rng = random.Random(f"{world.seed}:{split}:{stage}:{seed}")
    out: list[Question] = []
    while len(out) < n:
        kind = kinds[len(out) % len(kinds)]
        a, b = rng.sample(people, 2)
        if kind == "earlier" and world.people[a].birth_year == world.people[b].birth_year:
            continue
        if kind == "same_country" and _same_country(world, a, b) != (len(out) // len(kinds)) % 2:
            continue  # balanced yes/no, so the majority-answer baseline stays honest
        out.append(_question(world, kind, a, b, split, f"{split[0]}{stage}-{seed}-{len(out)}"))
    return out


def majority_answers(questions: Iterable[Question]) -> dict[str, str]:
    """The most common answer per question kind (the majority-answer baseline's guess)."""
    by_kind: dict[str, Counter[str]] = {}
    for q in questions:
        by_kind.setdefault(q.kind, Counter())[normalize_answer(q.answer)] += 1
    return {k: c.most_common(1)[0][0] for k, c in by_kind.items()}


def load_jsonl(path: str | Path) -> list[Question]:
    """Every row of a user dataset file (JSONL or Parquet, `mgrpo.datasets`) as a question."""
    return dataset_questions(parse(Path(path).read_bytes()), None)


def dataset_questions(rows: Sequence[Row], split: str | None) -> list[Question]:
    """A dataset's rows of one split (None: all) as questions, in file order."""
    return [
        Question(
            r.id or f"u{i}",
            r.query,
            r.answer,
            int(r.metadata.get("stage", 0) or 0),
            str(r.metadata.get("kind", "custom")),
            split=r.split,
        )
        for i, r in enumerate(rows, 1)
        if split is None or r.split == split
    ]


def epoch_sample(pool: Sequence[Question], step: int, n: int, *, seed: str) -> list[Question]:
    """Step `step`'s `n` questions of a finite pool: the pool in a seeded order per epoch, each
    question once per epoch (steps cut the concatenated epochs into runs of `n`)."""
    if not pool:
        raise ValueError("the question pool is empty")
    out: list[Question] = []
    for i in range(step * n, step * n + n):
        epoch, j = divmod(i, len(pool))
        order = list(range(len(pool)))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        out.append(pool[order[j]])
    return out


class Corpus:
    """BM25 `search` and `open` over documents: the built-in world's, or a user's (the example HTTP
    tool server, `examples/tool_server.py`, serves its own documents file through this)."""

    def __init__(self, docs: Sequence[Doc], *, top_k: int = 3) -> None:
        self.docs, self.top_k = list(docs), top_k
        self.by_id = {d.doc_id: d for d in self.docs}
        # bm25s runs a JAX op when it is imported if JAX is installed (GPU images often have it), and JAX
        # then takes 75 % of the GPU's memory away from the process's trainer (seen on an H200,
        # 2026-12-04): keep JAX on the CPU unless the user said otherwise. The search uses numpy.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        import bm25s  # after the line above: an optional import-time JAX op

        self._tokenizer = bm25s.tokenization.Tokenizer(stopwords=None, lower=True, splitter=r"(?u)\b\w+\b")
        corpus_tokens = self._tokenizer.tokenize(
            [f"{d.title} {d.text}" for d in self.docs], show_progress=False
        )
        self._index = bm25s.BM25()
        self._index.index(corpus_tokens, show_progress=False)

    def search(self, query: str) -> str:
        """Top-k documents for a query: one '<id> <title>' line each."""
        tokens = self._tokenizer.tokenize([query], update_vocab=False, show_progress=False)
        if not tokens or not tokens[0] or all(t == 0 and len(tokens[0]) == 1 for t in tokens[0]):
            return "no results"
        k = min(self.top_k, len(self.docs))
        ids, scores = self._index.retrieve(tokens, k=k, show_progress=False, backend_selection="numpy")
        hits = [self.docs[int(i)] for i, s in zip(ids[0], scores[0], strict=True) if s > 0]
        return "\n".join(f"{d.doc_id} {d.title}" for d in hits) or "no results"

    def open(self, doc_id: str) -> str:
        doc = self.by_id.get(doc_id.strip())
        return doc.text if doc else f"no document {doc_id.strip()!r}"


def load_documents(path: str | Path) -> list[Doc]:
    """A documents file: one JSON object a line with `id`, `text` and optionally `title`."""
    docs = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            docs.append(Doc(str(row["id"]), str(row.get("title", "")), str(row["text"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}:{n}: each line needs a JSON object with 'id' and 'text' ({exc})"
            ) from None
    if not docs:
        raise ValueError(f"{path}: no documents")
    return docs


class DeepResearchTask:
    """World + BM25 index + tools + scorers. `tools` (name → fn(argument) → text) and `scorers`
    ("correct": fn(answer, gold), "expert": fn(subtask, result)) are plain dicts a user can extend
    or replace, e.g. `task.tools["calc"] = my_calculator`."""

    def __init__(self, world: World | None = None, *, top_k: int = 3) -> None:
        self.world = world or generate_world()
        self.corpus = Corpus(self.world.docs, top_k=top_k)
        self.search = self.corpus.search
        self.tools: dict[str, Callable[[str], str]] = {
            "search": self.search,
            "open": self.open,
            "compare": compare,
        }
        self.scorers: dict[str, Callable[[str, str], float]] = {"correct": self.correct, "expert": self.judge}

    def open(self, doc_id: str) -> str:
        doc = self.world.doc_by_id(doc_id.strip())  # "d012" is d12, as the warm starts learnt it
        return doc.text if doc else f"no document {doc_id.strip()!r}"

    def call_tool(self, name: str, argument: str) -> str:
        tool = self.tools.get(name)
        return tool(argument) if tool else f"unknown tool {name!r}; tools: {', '.join(sorted(self.tools))}"

    def judge(self, subtask: str, result: str) -> float:
        """Expert score of a sub-agent result: 1 if it contains the subtask's fact, else 0; NaN if unscorable."""
        gold = fact(self.world, subtask)
        if gold is None:
            return math.nan
        return float(f" {normalize_answer(gold)} " in f" {normalize_answer(result)} ")

    @staticmethod
    def correct(answer: str, gold: str) -> float:
        return float(normalize_answer(answer) == normalize_answer(gold))
