"""Write `questions.jsonl`: questions about the built-in world (the one every default job's warm start
knows), in the dataset format a job's `dataset` takes, and `documents.jsonl`: the world's documents,
which `tool_server.py` searches. Run: .venv/bin/python examples/make_questions.py

Your own files have the same shapes: questions, one JSON object a line with `query`, `answer`, and
optionally `split` (default "train"), `id` and `metadata`; documents, `id`, `title` and `text`.
"""

from __future__ import annotations

import json
from pathlib import Path

from mgrpo.config import JobConfig
from mgrpo.tasks.deep_research import make_questions
from mgrpo.workflows.deep_research_warmstart import job_task

world = job_task(JobConfig()).world  # seed 0, 2000 people: the default job's world
rows = [
    {"query": q.text, "answer": q.answer, "split": split, "metadata": {"kind": q.kind}}
    for split, source, n in (("train", "train", 400), ("test", "heldout", 100))
    for q in make_questions(world, source, 2, n, seed=17)
]
out = Path(__file__).with_name("questions.jsonl")
out.write_text("".join(json.dumps(r) + "\n" for r in rows))
print(f"{out}: {len(rows)} rows")
docs = Path(__file__).with_name("documents.jsonl")
docs.write_text(
    "".join(json.dumps({"id": d.doc_id, "title": d.title, "text": d.text}) + "\n" for d in world.docs)
)
print(f"{docs}: {len(world.docs)} documents")
