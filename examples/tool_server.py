"""An HTTP tool endpoint a job's tool-using role can call: `search` and `open` over your documents.

    POST /tool  {"name": "search" | "open", "argument": "…"}  →  {"result": "…"}

Run: .venv/bin/uvicorn --app-dir examples tool_server:app --port 9200
and name it in the job (examples/tools-job.yaml):
    roles: {subagent: {tools: [{name: search, kind: http, url: "http://127.0.0.1:9200/tool"}, …]}}

The documents are a JSONL file, one `{"id", "title", "text"}` a line: MGRPO_TOOL_DOCS, by default
examples/documents.jsonl (the built-in world's, written by make_questions.py, which the demo's
warm-started sub-agent knows how to look through). `search` answers the top 3 BM25 hits as
`<id> <title>` lines, `open` a document's text. Put your own tools in `TOOLS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from mgrpo.tasks.deep_research import Corpus, load_documents

DOCS = Path(os.environ.get("MGRPO_TOOL_DOCS", Path(__file__).with_name("documents.jsonl")))
corpus = Corpus(load_documents(DOCS))
TOOLS: dict[str, Callable[[str], str]] = {"search": corpus.search, "open": corpus.open}

app = FastAPI(title="example tool endpoint")


class Call(BaseModel):
    name: str
    argument: str = Field(max_length=10_000)


@app.post("/tool")
def tool(call: Call) -> dict[str, str]:
    fn = TOOLS.get(call.name)
    if fn is None:
        raise HTTPException(404, f"no tool {call.name!r}; tools: {', '.join(TOOLS)}")
    return {"result": fn(call.argument)}
