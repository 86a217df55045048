"""R rollout replicas of one role behind one engine (`MGRPO_SGLANG_URL=http://a,http://b,…`): each
call's prompts are spread over the replicas, and every new policy reaches them all.

Routing, what sglang-router's cache-aware policy does in small: prompts that begin alike (the same
first `PREFIX_TOKENS` tokens: one query's group of rollouts, whose turns share the query and
transcript so far) go to the replica that served that prefix before, so its radix cache holds the
prefix; a prefix not seen yet goes to the replica with the fewest prompts in flight. The sub-batches
go out in parallel and the samples come back in the caller's order. `update_weights` pushes the
folder to every replica at once and raises if any refuses, so no replica silently serves an old
policy; the policy version moves only when all hold the new one."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch

from mgrpo.engines.base import Sample, SamplingParams
from mgrpo.engines.sglang import SGLangEngine

PREFIX_TOKENS = 32  # tokens that name a prompt's prefix for routing
REMEMBERED = 4096  # prefixes whose replica is remembered (least recently used forgotten first)


class ReplicatedEngine:
    shares_weights = False  # the replicas hold their own copies: the trainer pushes every checkpoint

    def __init__(self, replicas: Sequence[SGLangEngine]) -> None:
        if not replicas:
            raise ValueError("ReplicatedEngine needs at least one replica")
        self.replicas = list(replicas)
        self.weights_version = 0
        self.weight_sync = replicas[0].weight_sync  # the same for every replica (runtime.rollout_engine)
        self.broadcasts = replicas[0].broadcasts
        self.in_flight = [0] * len(self.replicas)  # prompts sent and not yet answered, per replica
        self._home: OrderedDict[tuple[int, ...], int] = OrderedDict()  # prefix → its replica
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix="replica")

    def route(self, prompts: list[list[int]]) -> list[int]:
        """The replica of each prompt (counted in flight until `_done`)."""
        out = []
        with self._lock:
            for prompt in prompts:
                key = tuple(prompt[:PREFIX_TOKENS])
                r = self._home.get(key)
                if r is None:
                    r = min(range(len(self.replicas)), key=lambda i: (self.in_flight[i], i))
                self._home[key] = r
                self._home.move_to_end(key)
                if len(self._home) > REMEMBERED:
                    self._home.popitem(last=False)
                self.in_flight[r] += 1
                out.append(r)
        return out

    def _done(self, r: int, n: int) -> None:
        with self._lock:
            self.in_flight[r] -= n

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        where = self.route(prompts)
        jobs = {}
        for r in sorted(set(where)):
            idx = [i for i, w in enumerate(where) if w == r]
            jobs[r] = (idx, self._pool.submit(self._generate_on, r, [prompts[i] for i in idx], params))
        out: list[Sample | None] = [None] * len(prompts)
        for idx, future in jobs.values():
            for i, sample in zip(idx, future.result(), strict=True):
                out[i] = sample
        return [s for s in out if s is not None]

    def _generate_on(self, r: int, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        try:
            return self.replicas[r].generate(prompts, params)
        finally:
            self._done(r, len(prompts))

    def update_weights(self, path: str, version: int | None = None) -> None:
        """Every replica loads the folder (in parallel); the version moves when all did."""
        new = self.weights_version + 1 if version is None else version
        for future in [self._pool.submit(e.update_weights, path, new) for e in self.replicas]:
            future.result()
        self.weights_version = new

    def load_adapter(self, path: str, version: int) -> None:
        """Every replica loads the LoRA adapter folder (in parallel); the version moves when all did."""
        for future in [self._pool.submit(e.load_adapter, path, version) for e in self.replicas]:
            future.result()
        self.weights_version = version

    def push_weights(self, model: torch.nn.Module, version: int) -> None:
        """Every replica takes `model`'s parameters by broadcast (one after another: each has its own
        group); the version moves when all did."""
        for e in self.replicas:
            e.push_weights(model, version)
        self.weights_version = version

    @contextmanager
    def paused(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for e in self.replicas:
            e.close()
