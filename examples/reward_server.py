"""A reward endpoint a job can call (`reward: {kind: http, url: http://127.0.0.1:9100/reward}`): it
takes a batch of answers with their reference answers and returns one reward in [0, 1] each.
Run: .venv/bin/uvicorn --app-dir examples reward_server:app --port 9100

This one gives 1 for the right answer, 0.2 for an answer that names the right thing among other
words, and 0 otherwise; put your own scoring in `score`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from mgrpo.algo.rewards import normalize_answer

app = FastAPI(title="example reward endpoint")


class Item(BaseModel):
    query: str
    answer: str
    reference: str
    metadata: dict[str, Any] = {}


class Batch(BaseModel):
    items: list[Item]


def score(item: Item) -> float:
    answer, reference = normalize_answer(item.answer), normalize_answer(item.reference)
    if answer == reference:
        return 1.0
    return 0.2 if reference and f" {reference} " in f" {answer} " else 0.0


@app.post("/reward")
def reward(batch: Batch) -> dict[str, list[float]]:
    return {"rewards": [score(i) for i in batch.items]}
