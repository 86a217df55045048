"""A rollout server that speaks SGLang's HTTP API, backed by the `hf` engine: `mgrpo engine MODEL_DIR`.

It answers what the `sglang` engine client (`mgrpo.engines.sglang`) sends, so a trainer rolls out in
another process exactly as it would against SGLang (`MGRPO_SGLANG_URL`), on machines SGLang does not
run on (CPUs):

- `POST /generate`: `input_ids` (one prompt or a batch), `sampling_params` (one for all, or one per
  prompt), `return_logprob`; each result carries `meta_info.output_token_logprobs` and the
  `weight_version` that sampled it. Requests join the engine's running batch (continuous batching).
- `POST /update_weights_from_disk`: a `save_pretrained` folder; `POST /init_weights_update_group` and
  `POST /update_weights_from_distributed`: the trainer broadcasts each new policy (gloo on CPUs), a
  tensor per broadcast or, with `load_format: "flattened_bucket"`, a bucket of them per broadcast; a
  policy sent in several buckets is swapped in once all its parameters came.
- `POST /load_lora_adapter` `{"lora_name", "lora_path"}` (a peft adapter folder on a base this server
  serves) and `POST /unload_lora_adapter` `{"lora_name"}`: SGLang's LoRA API, as a LoRA role's trainer
  sends it (`mgrpo.lora`): only the adapter travels. A `/generate` names a loaded adapter per prompt
  (`lora_path`) or none (the base); each role's adapters sample from a copy of the base with its
  newest adapter merged in (`services.engine_adapters`), so roles on one base share the server. An
  adapter's version is the `-v<N>` its name ends with; a `/generate` naming an adapter that is not
  loaded is a 400, and each result says which adapter version sampled it (`meta_info.lora_version`).
  A full-weights update drops the adapters.
- `GET /get_server_info`, `GET /health`.

New weights are swapped in between two decode steps (the engine keeps its own copy): rows already
running finish on the weights they started with, so a push never waits for a rollout to drain. Why a
process of its own: the rollout then runs beside the trainer's update without sharing its
interpreter lock, and with `max_staleness: 1` the next step's rollouts run while this step trains
(`bench/trl_throughput.py --engine-server`).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from typing import Any, Literal, cast

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel

from mgrpo.engines.base import Sample, SamplingParams
from mgrpo.engines.hf import HFEngine
from mgrpo.engines.sglang import weight_version
from mgrpo.models import load
from mgrpo.parallel.weight_group import broadcast_tensors, open_weight_group, unflatten_bytes
from services.engine_adapters import ServedAdapters

OnRequest = Callable[[str, Any], None]  # (endpoint, what it got): an observer, e.g. for tests


class SGLangSampling(BaseModel):
    """The sampling parameters this server honours; SGLang's cosmetic ones are ignored."""

    model_config = ConfigDict(extra="ignore")
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, description="only -1 (off): the hf engine samples from the whole vocabulary")
    stop_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    sampling_seed: int | None = None

    def params(self) -> SamplingParams:
        if self.top_k != -1:
            raise HTTPException(422, f"top_k {self.top_k} is not supported here: send -1 (off)")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            stop=stop,
            seed=self.sampling_seed,
        )


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input_ids: list[list[int]] | list[int] = Field(
        description="token ids of one prompt or a batch (this server does not tokenize text)"
    )
    sampling_params: SGLangSampling | list[SGLangSampling] = Field(default_factory=SGLangSampling)
    return_logprob: bool = False
    lora_path: str | list[str | None] | None = Field(
        None, description="the loaded LoRA adapter (its name) to sample with: one for all, or one per prompt"
    )


class LoraLoad(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)


class LoraUnload(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=256)


class DiskUpdate(BaseModel):
    model_path: str
    weight_version: str | None = None


class GroupInit(BaseModel):
    master_address: str
    master_port: int = Field(ge=1, le=65535)
    rank_offset: int = Field(ge=1)
    world_size: int = Field(ge=2)
    group_name: str
    backend: str = "gloo"


class DistributedUpdate(BaseModel):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str
    weight_version: str | None = None
    flush_cache: bool = True
    load_format: Literal["flattened_bucket"] | None = Field(
        None, description="flattened_bucket: the tensors come as one broadcast of their bytes, in order"
    )


class EngineServer:
    """What the endpoints do, over one engine (see `make_app`)."""

    def __init__(
        self, engine: HFEngine, staging: PreTrainedModel | None, on_request: OnRequest | None
    ) -> None:
        if not engine.shares_weights and staging is None:
            raise ValueError("an own-weights engine needs a staging model to receive broadcast weights into")
        self.engine, self.staging = engine, staging
        self.note: OnRequest = on_request or (lambda endpoint, got: None)
        self.groups: dict[str, Any] = {}
        self.arrived: set[str] = set()  # the staged tensors of a bucketed push not swapped in yet
        # the loaded LoRA adapters, each role's on an engine of its own
        self.adapters = ServedAdapters(engine)

    async def generate(self, req: GenerateRequest) -> Any:
        ids = req.input_ids
        single = bool(ids) and isinstance(ids[0], int)
        prompts = [cast(list[int], ids)] if single else cast(list[list[int]], ids)
        if not prompts or any(not p for p in prompts):
            raise HTTPException(422, "input_ids: send at least one prompt, each of at least one token")
        vocab = int(self.engine.model.config.vocab_size)
        if (bad := next((t for p in prompts for t in p if not 0 <= t < vocab), None)) is not None:
            raise HTTPException(
                422, f"input_ids: token id {bad} is outside the model's vocabulary (0 to {vocab - 1})"
            )
        per = (
            req.sampling_params
            if isinstance(req.sampling_params, list)
            else [req.sampling_params] * len(prompts)
        )
        if len(per) != len(prompts):
            raise HTTPException(
                422, f"sampling_params: {len(per)} for {len(prompts)} prompts; send one, or one per prompt"
            )
        params = [s.params() for s in per]
        names = req.lora_path if isinstance(req.lora_path, list) else [req.lora_path] * len(prompts)
        if len(names) != len(prompts):
            raise HTTPException(
                422, f"lora_path: {len(names)} for {len(prompts)} prompts; send one, or one per prompt"
            )
        if unknown := sorted({n for n in names if n is not None and n not in self.adapters.loaded}):
            raise HTTPException(
                400, f"lora_path: adapter {unknown[0]!r} is not loaded; POST /load_lora_adapter first"
            )
        self.note("generate", len(prompts))
        if any(n is not None for n in names):
            self.note("generate_lora", names)
        futures = [
            self.adapters.engine_for(n).submit(p, sp) for p, sp, n in zip(prompts, params, names, strict=True)
        ]
        samples = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        out = [_result(s, len(p)) for s, p in zip(samples, prompts, strict=True)]
        for o, s, name in zip(out, samples, names, strict=True):
            if name is not None:
                o["meta_info"]["lora_version"] = str(s.weights_version)
        return out[0] if single else out

    def load_lora(self, req: LoraLoad) -> dict[str, Any]:
        """Serve an adapter folder under its name (`services.engine_adapters`)."""
        self.note("load_lora", req.lora_name)
        try:
            version = self.adapters.load(req.lora_name, req.lora_path)
        except ValueError as exc:
            return {"success": False, "error_message": str(exc)}
        return {"success": True, "message": f"adapter {req.lora_name} served as weights version {version}"}

    def unload_lora(self, req: LoraUnload) -> dict[str, Any]:
        self.note("unload_lora", req.lora_name)
        if not self.adapters.unload(req.lora_name):
            return {"success": False, "error_message": f"no adapter {req.lora_name!r} is loaded"}
        return {"success": True, "message": f"unloaded {req.lora_name}"}

    def update_from_disk(self, req: DiskUpdate) -> dict[str, Any]:
        self.note("update", req.model_path)
        try:
            version = weight_version(req.weight_version, self.engine.weights_version + 1)
            self.engine.update_weights(req.model_path, version)
            self.adapters.drop()
        except (ValueError, OSError) as exc:
            return {"success": False, "message": str(exc)}
        return {"success": True, "message": f"loaded {req.model_path}"}

    def init_group(self, req: GroupInit) -> dict[str, Any]:
        self.note("init_group", req.model_dump())
        try:
            self.groups[req.group_name] = open_weight_group(
                req.backend,
                req.master_address,
                req.master_port,
                req.world_size,
                req.rank_offset,
                req.group_name,
                timeout_s=60,
            )
        except (RuntimeError, ValueError) as exc:
            return {
                "success": False,
                "message": f"could not join {req.master_address}:{req.master_port}: {exc}",
            }
        return {"success": True, "message": "joined"}

    def update_distributed(self, req: DistributedUpdate) -> dict[str, Any]:
        self.note("update_distributed", req.weight_version)
        if req.group_name not in self.groups:
            return {
                "success": False,
                "message": f"no weight group {req.group_name!r}: call /init_weights_update_group first",
            }
        engine = self.engine
        device = engine.model.device  # where the group's backend moves them (NCCL: the served GPU)
        dtypes = [getattr(torch, d) for d in req.dtypes]
        group = self.groups[req.group_name]
        if req.load_format == "flattened_bucket":  # every rank takes part, whatever follows
            size = sum(
                math.prod(s) * torch.empty((), dtype=d).element_size()
                for d, s in zip(dtypes, req.shapes, strict=True)
            )
            buffer = torch.empty(size, dtype=torch.uint8, device=device)
            torch.distributed.broadcast(buffer, src=0, group=group)
            received = unflatten_bytes(buffer, dtypes, req.shapes)
        else:
            received = [
                torch.empty(s, dtype=d, device=device) for d, s in zip(dtypes, req.shapes, strict=True)
            ]
            broadcast_tensors(received, group)
        params = dict((engine.model if self.staging is None else self.staging).named_parameters())
        missing = [n for n in req.names if n not in params]
        if missing:
            return {"success": False, "message": f"unknown parameters {missing[:3]}: is it the same model?"}
        version = weight_version(req.weight_version, engine.weights_version + 1)
        self.adapters.drop()
        with engine.paused() if self.staging is None else nullcontext(), torch.no_grad():
            torch._foreach_copy_([params[n] for n in req.names], received)
        if self.staging is None:  # taken in place, while paused
            engine.weights_version = version
            return {"success": True, "message": f"weights version {version}"}
        if req.load_format == "flattened_bucket":  # a policy split in buckets is never served half-way
            self.arrived.update(req.names)
            if not self.arrived >= params.keys():
                return {
                    "success": True,
                    "message": f"{len(self.arrived)} of {len(params)} tensors of "
                    f"weights version {version}: the rest to come",
                }
            self.arrived.clear()
        engine.push_weights(
            self.staging, version
        )  # swapped in between two decode steps; running rows keep theirs
        return {"success": True, "message": f"weights version {version}"}


def make_app(
    engine: HFEngine,
    staging: PreTrainedModel | None = None,
    *,
    model_path: str = "",
    on_request: OnRequest | None = None,
) -> FastAPI:
    """The server's app over `engine`. An own-weights engine takes broadcast weights through
    `staging` (a model of the same shapes, received into, then pushed: running rows keep theirs); an
    engine sharing its model's weights takes them in place while paused. `model_path`: what
    `/get_server_info` names; `on_request(endpoint, what)` observes every request."""
    server = EngineServer(engine, staging, on_request)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        server.adapters.drop()  # the adapters' engines; the caller closes `engine`

    app = FastAPI(title="mgrpo engine", description=__doc__, lifespan=lifespan)
    app.state.server = server

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/get_server_info")
    def server_info() -> dict[str, Any]:
        return {
            "tp_size": 1,
            "model_path": model_path,
            "weight_version": str(engine.weights_version),
            "max_batch": engine.max_batch,
            "forward_passes": engine.forward_passes,  # grows while rows decode (a test waits on it)
        }

    app.post("/generate")(server.generate)
    app.post("/update_weights_from_disk")(server.update_from_disk)
    app.post("/init_weights_update_group")(server.init_group)
    app.post("/update_weights_from_distributed")(server.update_distributed)
    app.post("/load_lora_adapter")(server.load_lora)
    app.post("/unload_lora_adapter")(server.unload_lora)
    return app


def _result(s: Sample, prompt_tokens: int) -> dict[str, Any]:
    return {
        "text": s.text,
        "output_ids": s.token_ids,
        "meta_info": {
            "finish_reason": {"type": "length" if s.finish_reason == "length" else "stop"},
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(s.token_ids),
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(s.logprobs, s.token_ids, strict=True)],
            "weight_version": str(s.weights_version),
        },
    }


def serve_app(model_dir: str, *, max_batch: int = 64) -> tuple[FastAPI, HFEngine]:
    """The app of `mgrpo engine`: the model loaded from `model_dir`, an own-weights `hf` engine."""
    model, tokenizer = load(model_dir)
    engine = HFEngine(model, tokenizer, max_batch=max_batch, own_weights=True)
    return make_app(engine, staging=model, model_path=model_dir), engine
