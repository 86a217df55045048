"""Reproducible warm starts (`mgrpo.reproducibility`): identical weights from two processes, cache keys
that cover every version, generated data pinned to its version, CPU numerics pinned."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from mgrpo import reproducibility
from mgrpo.models import PRESETS, train_tokenizer
from mgrpo.reproducibility import RECIPE_VERSIONS, cache_key
from mgrpo.tasks.arithmetic import make_problems
from mgrpo.tasks.deep_research import DeepResearchTask, make_questions, team_role
from mgrpo.tasks.demos import comparer_demo, planner_demo, single_agent_demo, subagent_demo, subtasks_of
from mgrpo.tasks.world import generate_world
from mgrpo.workflows.deep_research_warmstart import WarmstartConfig
from mgrpo.workflows.marsrl_warmstart import MarsWarmstartConfig
from mgrpo.workflows.marsrl_warmstart import demo as marsrl_demo

ROOT = Path(__file__).resolve().parents[2]

# A small warm start run in a fresh process: prints a hash of every weight file and of eval.json.
WARMSTART = """
import hashlib, json, sys
from pathlib import Path
from mgrpo.workflows.deep_research_warmstart import WarmstartConfig, run_warmstart
out = Path(sys.argv[1])
run_warmstart(WarmstartConfig(n_people=80, steps=4, batch_size=8, eval_questions=6), out)
files = sorted(out.rglob("*.safetensors")) + [out / "eval.json"]
print(json.dumps({str(f.relative_to(out)): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}))
"""


def _warmstart_in_a_process(out: Path, **env: str) -> dict[str, str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    proc = subprocess.run(
        [sys.executable, "-c", WARMSTART, str(out)], capture_output=True, text=True, env=full, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def _has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.slow
def test_two_warm_starts_give_identical_weights_and_evaluations(tmp_path):
    """Two processes with different hash seeds and thread counts train bit-identical models and score
    them identically (MKL's STRICT mode: on an Intel AVX-512 host 1 and 2 threads differed without
    it). A third with ATen's generic (non-AVX2) kernels does not: the pinning matters."""
    a = _warmstart_in_a_process(tmp_path / "a", PYTHONHASHSEED="1", OMP_NUM_THREADS="2")
    b = _warmstart_in_a_process(tmp_path / "b", PYTHONHASHSEED="2", OMP_NUM_THREADS="1")
    assert set(a) == {"planner/model.safetensors", "subagent/model.safetensors", "eval.json"}
    assert a == b
    if _has_avx2():
        other = _warmstart_in_a_process(tmp_path / "c", ATEN_CPU_CAPABILITY="default")
        assert other["planner/model.safetensors"] != a["planner/model.safetensors"]


def test_every_mgrpo_process_pins_the_cpu_numerics():
    code = "import os, mgrpo; print(os.environ.get('ATEN_CPU_CAPABILITY'), os.environ.get('MKL_CBWR'))"
    env = {k: v for k, v in os.environ.items() if k not in reproducibility.NUMERICS_ENV}

    def run(**extra: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "PYTHONPATH": str(ROOT), **extra},
            check=True,
        )
        return proc.stdout.strip()

    if _has_avx2():
        assert run() == "avx2 AVX2,STRICT"
    assert run(ATEN_CPU_CAPABILITY="avx512") == "avx512 " + (
        "AVX2,STRICT" if _has_avx2() else "None"
    )  # the user's wins
    assert run(MGRPO_PIN_CPU_NUMERICS="0") == "None None"


def test_the_cache_key_covers_versions_presets_and_libraries(monkeypatch):
    cfg = WarmstartConfig()
    base = cfg.key()
    assert WarmstartConfig().key() == base and WarmstartConfig(seed=1).key() != base
    for name in RECIPE_VERSIONS:  # every generator's version is in the key
        monkeypatch.setitem(RECIPE_VERSIONS, name, RECIPE_VERSIONS[name] + 1)
        assert cfg.key() != base, name
        monkeypatch.setitem(RECIPE_VERSIONS, name, RECIPE_VERSIONS[name] - 1)
    assert cfg.key() == base
    monkeypatch.setitem(PRESETS, "tiny", {**PRESETS["tiny"], "num_hidden_layers": 5})  # a preset's shape
    assert cfg.key() != base and MarsWarmstartConfig().key() != MarsWarmstartConfig(seed=1).key()
    monkeypatch.undo()
    env = reproducibility.environment()
    monkeypatch.setattr(
        reproducibility,
        "environment",
        lambda: {**env, "libraries": {**env["libraries"], "torch": "0.0.0"}},
    )
    assert cfg.key() != base  # another torch


def test_provenance_records_what_the_key_covers():
    record = json.loads(WarmstartConfig().provenance())
    assert record["config"] == WarmstartConfig().as_dict() and record["recipe"] == RECIPE_VERSIONS
    assert set(record["libraries"]) == {"torch", "transformers", "tokenizers"} and "numerics" in record
    assert cache_key(record["config"], presets=record["presets"]) == WarmstartConfig().key()


def _digest(items: list[str]) -> str:
    return hashlib.sha256("\n".join(items).encode()).hexdigest()[:16]


def generated_data_fingerprints() -> dict[str, str]:
    """What each versioned generator produces on a small seeded input, hashed."""
    world = generate_world(0, n_people=120)
    task = DeepResearchTask(world)
    qs = [
        make_questions(world, split, stage, 12, seed=3) for split in ("train", "heldout") for stage in (1, 2)
    ]
    questions = [q for group in qs for q in group]
    tok = train_tokenizer([d.text for d in world.docs], 320)  # decoded text does not depend on the merges
    subs = subtasks_of(task, questions[:12])
    demos = (
        [planner_demo(task, tok, q) for q in questions[:12]]
        + [subagent_demo(task, tok, s) for s in subs]
        + [single_agent_demo(task, tok, q) for q in questions[12:24]]
        + [
            comparer_demo(tok, s)
            for s in subtasks_of(task, questions[:12], team=True)
            if team_role(s) == "comparer"
        ]
    )
    problems = make_problems("train", 20, seed=5) + make_problems("heldout", 5, seed=5, n_ops=3)
    rng = random.Random(0)
    marsrl = [
        tok.decode(marsrl_demo(role, p, tok, rng).token_ids)
        for p in problems
        for role in ("solver", "verifier", "corrector")
    ]
    return {
        "world": _digest([f"{d.title}|{d.text}" for d in world.docs] + world.heldout_people),
        "questions": _digest([f"{q.qid}|{q.text}|{q.answer}|{q.kind}" for q in questions]),
        "demos": _digest([tok.decode(t.token_ids) for t in demos]),
        "arithmetic": _digest([repr(p) for p in problems] + marsrl),
    }


# The fingerprints at each version: a change to a generator's output without a version bump fails here.
GOLDEN = {
    ("world", 1): "01271ff3f034762a",
    ("questions", 1): "dd3e48f2f126a33e",
    ("demos", 2): "b3a69aba6d26314a",
    ("arithmetic", 1): "eea1582b21182403",
}


def test_generated_data_changes_only_with_its_version():
    for name, digest in generated_data_fingerprints().items():
        version = RECIPE_VERSIONS[name]
        assert GOLDEN.get((name, version)) == digest, (
            f"what the {name!r} generator produces changed (fingerprint {digest}). If that is intended, bump "
            f"RECIPE_VERSIONS[{name!r}] in mgrpo/reproducibility.py, so cached warm starts are rebuilt, and "
            f"add ({name!r}, {version + 1}): {digest!r} to GOLDEN here."
        )
