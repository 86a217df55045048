"""What a trainer service needs to start a job: the job's task and its role's model, from the
cached warm start (presets) or a folder (path)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mgrpo.config import JobConfig
from mgrpo.engines.base import RolloutEngine
from mgrpo.engines.hf import HFEngine
from mgrpo.engines.replicas import ReplicatedEngine
from mgrpo.engines.sglang import SGLangEngine, WeightSync
from mgrpo.models import load, place
from mgrpo.tasks.deep_research import DeepResearchTask
from mgrpo.warmstart import WarmstartConfig, cached_warmstart, make_task
from mgrpo.workflows import get_workflow
from mgrpo.workflows.marsrl_warmstart import ROLES as MARS_ROLES
from mgrpo.workflows.marsrl_warmstart import MarsWarmstartConfig
from mgrpo.workflows.marsrl_warmstart import cached_warmstart as cached_marsrl_warmstart

RoleName = str  # a role of the job's workflow, or "single" (the single-agent baseline's model)


def resolve_device(name: str) -> torch.device:
    """`cpu`, `cuda`, `cuda:N` or `auto` → a torch device; a GPU that is not there is a clear error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} asked for, but torch sees no GPU; set MGRPO_DEVICE=cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise RuntimeError(f"device {name!r} asked for, but torch sees {torch.cuda.device_count()} GPU(s)")
    return device


def warmstart_config(job: JobConfig) -> WarmstartConfig:
    steps = 350 if job.warmstart_steps is None else job.warmstart_steps
    wf = get_workflow(job.workflow)  # not job.flow: single_agent mode still names the warm start's sub-agent
    callee = "subagent" if "subagent" in wf.role_names else wf.callees[0]
    return WarmstartConfig(
        seed=job.seed,
        n_people=job.n_people,
        steps=steps,
        planner_preset=job.model_of("planner").preset or "tiny",
        subagent_preset=job.model_of(callee).preset or "tiny-wide",
        eval_questions=100 if steps >= 100 else 0,
    )


def marsrl_warmstart_config(job: JobConfig) -> MarsWarmstartConfig:
    default = MarsWarmstartConfig()
    steps = default.steps if job.warmstart_steps is None else job.warmstart_steps
    solver, verifier, corrector = (job.model_of(r).preset or default.preset(r) for r in MARS_ROLES)
    return MarsWarmstartConfig(
        seed=job.seed,
        steps=steps,
        n_ops=job.marsrl.n_ops,
        solver_preset=solver,
        verifier_preset=verifier,
        corrector_preset=corrector,
        shared_preset=solver,
        eval_problems=100 if steps >= 100 else 0,
    )


def job_task(job: JobConfig) -> DeepResearchTask:
    return make_task(warmstart_config(job))


def role_model_source(job: JobConfig, role: RoleName, cache_dir: Path) -> str:
    """Where the role's starting model is: `path` when given, else the (cached) warm start of its preset.
    A MarsRL root whose model other roles share starts from the shared warm start."""
    spec = job.model_of("planner" if role == "single" else role)
    if spec.path is not None:
        return spec.path
    if job.engine == "marsrl":
        shared = role == job.flow.root and len(job.root_roles) > 1
        return str(
            cached_marsrl_warmstart(marsrl_warmstart_config(job), cache_dir).path(
                "shared" if shared else role
            )
        )
    if job.engine == "deep_research_team" and role != "single":
        if role == "comparer" and spec.preset != "tiny":
            raise ValueError(
                "roles.comparer.model: the team warm start trains the comparer from the 'tiny' preset; give a path for another model"
            )
        return str(cached_warmstart(warmstart_config(job), cache_dir, team=True).folder / role)
    result = cached_warmstart(warmstart_config(job), cache_dir, single_agent=role == "single")
    return str(result.subagent_path if role == "subagent" else result.planner_path)


def load_role_model(
    job: JobConfig, role: RoleName, cache_dir: Path
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """The role's starting model (see `role_model_source`)."""
    return load(role_model_source(job, role, cache_dir))


def rollout_engine(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    sglang_url: str,
    *,
    weights: str,
    max_batch: int = 64,
    own_weights: bool = False,
    version: int = 0,
    sync_host: str = "",
) -> RolloutEngine:
    """The trainer's rollout engine: the in-process `hf` engine on the trainer's model (`own_weights`:
    on its own copy, swapped at each push), or, with `sglang_url`, that SGLang server (several,
    comma-separated: its replicas, `mgrpo.engines.replicas`), first loaded with `weights` (a folder
    the servers can read) as policy `version`; with `sync_host`, the servers take `model` itself and
    every later policy by broadcast from that address (`mgrpo.engines.sglang`)."""
    if not sglang_url:
        return HFEngine(model, tokenizer, max_batch=max_batch, own_weights=own_weights, version=version)
    urls = [u.strip() for u in sglang_url.split(",") if u.strip()]
    sync: WeightSync = "distributed" if sync_host else "disk"
    servers = [
        SGLangEngine(u, eos_token_id=tokenizer.eos_token_id, weight_sync=sync, sync_host=sync_host)
        for u in urls
    ]
    engine = servers[0] if len(servers) == 1 else ReplicatedEngine(servers)
    if sync_host:
        engine.push_weights(model, version)
    else:
        engine.update_weights(weights, version)
    return engine


def reference_model(
    job: JobConfig, role: RoleName, cache_dir: Path, device: torch.device | str = "cpu"
) -> PreTrainedModel | None:
    """The frozen starting model the KL penalty anchors to (None when the role's kl_coef is 0).
    A resumed trainer loads it again from the job's source, not from its checkpoint."""
    optim = job.optim_of("planner" if role == "single" else role)
    if optim.kl_coef == 0:
        return None
    model, _ = load_role_model(job, role, cache_dir)
    return place(model, device).eval().requires_grad_(False)
