"""Shipped warm starts (`mgrpo.workflows.shipped`): every built-in default is shipped and its files
match the manifest's sha256; a demo or a test gets them instead of building; a changed recipe, or a
changed file, is a clear error naming the command that rebuilds them, never a silent rebuild."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict

import pytest

from mgrpo.config import JobConfig
from mgrpo.reproducibility import RECIPE_VERSIONS
from mgrpo.workflows import job_spec, shipped
from mgrpo.workflows.deep_research_warmstart import WarmstartConfig, cached_warmstart
from mgrpo.workflows.marsrl_warmstart import MarsWarmstartConfig

DEFAULTS = [
    ("warmstart", WarmstartConfig().as_dict(), WarmstartConfig().presets()),
    ("team", WarmstartConfig().as_dict(), WarmstartConfig().presets()),
    ("shared", WarmstartConfig().as_dict(), WarmstartConfig().presets()),
    ("shared_team", WarmstartConfig().as_dict(), WarmstartConfig().presets()),
    ("marsrl", asdict(MarsWarmstartConfig()), MarsWarmstartConfig().presets()),
]


@pytest.mark.parametrize(("kind", "config", "presets"), DEFAULTS, ids=[k for k, _, _ in DEFAULTS])
def test_every_default_warm_start_is_shipped_and_matches_its_manifest(kind, config, presets):
    folder = shipped.find(kind, config, presets)
    assert folder is not None and (folder / "eval.json").exists()
    entry = next(e for e in shipped.manifest()["warm_starts"] if e["folder"] == folder.name)
    assert shipped.file_digests(folder) == entry["files"]  # every file, its sha256
    assert entry["built"]["command"] == shipped.REBUILD and entry["built"]["code"]


def test_the_jobs_and_the_demo_start_from_the_shipped_bytes(tmp_path):
    """The default job's warm start is the shipped one: nothing is built into the cache."""
    for config in ({}, {"workflow": "marsrl"}, {"workflow": "deep_research_team"}):
        job = job_spec(JobConfig.model_validate(config))
        built = job.warm_start().build(job.warmstart_config(), tmp_path)
        assert built.cached and built.folder.parent == shipped.SHIPPED, config
    assert not list(tmp_path.iterdir())


def test_a_changed_recipe_is_an_error_naming_the_rebuild(monkeypatch, tmp_path):
    """A generator's version bumped (its code changed) without rebuilding the shipped files: the demo
    and the tests stop with the command to run, instead of building for minutes or starting elsewhere."""
    monkeypatch.setitem(RECIPE_VERSIONS, "demos", RECIPE_VERSIONS["demos"] + 1)
    with pytest.raises(shipped.StaleShippedError, match="make warmstart"):
        cached_warmstart(WarmstartConfig(), tmp_path)
    assert not list(tmp_path.iterdir())  # nothing was built
    other = WarmstartConfig(n_people=60, steps=1, batch_size=4, eval_questions=0)
    assert cached_warmstart(other, tmp_path).folder.exists()  # another config builds as before


def test_a_changed_file_is_an_error_naming_the_rebuild(tmp_path):
    root = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED, root)
    kind, config, presets = DEFAULTS[0]
    folder = shipped.find(kind, config, presets, root)
    assert folder is not None
    weights = folder / "planner" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    shipped._verified.cache_clear()
    with pytest.raises(shipped.StaleShippedError, match=r"planner/model\.safetensors.*make warmstart"):
        shipped.find(kind, config, presets, root)


def test_ship_records_a_built_folder_that_find_then_returns(tmp_path):
    built = tmp_path / "built"
    (built / "planner").mkdir(parents=True)
    (built / "planner" / "model.safetensors").write_bytes(b"weights")
    (built / "eval.json").write_text("{}")
    config, presets = {"seed": 7}, {"tiny": {}}
    entry = shipped.ship("toy", config, presets, built, tmp_path / "root")
    assert entry["files"] == shipped.file_digests(tmp_path / "root" / entry["folder"])
    assert shipped.find("toy", config, presets, tmp_path / "root") == tmp_path / "root" / entry["folder"]
    assert shipped.find("toy", {"seed": 8}, presets, tmp_path / "root") is None


def test_the_fingerprint_is_what_sha256sum_prints_over_the_folder(tmp_path):
    """The README's check, `find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum`, in the
    folder gives the fingerprint the demo prints (a reordered or a changed file would change it)."""
    import hashlib
    import subprocess

    (tmp_path / "b").mkdir()
    for name, text in (("z.json", "{}"), ("b/model.safetensors", "weights"), ("A.txt", "x")):
        (tmp_path / name).write_text(text)
    out = subprocess.run(
        "find . -type f | sed 's#^\\./##' | LC_ALL=C sort | xargs sha256sum | sha256sum",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[0]
    files = shipped.file_digests(tmp_path)
    assert shipped.fingerprint(files) == out
    assert files["b/model.safetensors"] == hashlib.sha256(b"weights").hexdigest()
    line = shipped.provenance(shipped.SHIPPED / shipped.manifest()["warm_starts"][0]["folder"])
    assert line is not None and line.startswith("sha256 ") and shipped.provenance(tmp_path) is None


# ---- baselines: a shipped warm start's held-out outcomes ---------------------------------------------
def _demo_baseline() -> tuple[object, object, object, str]:
    """The demo's warm start and the key of its baseline for this processor's numerics."""
    from mgrpo.workflows.deep_research_warmstart import job_task
    from mgrpo.workflows.demo_baseline import DEMO_EVAL_QUESTIONS, baseline_key, numerics_fingerprint

    cfg, task = WarmstartConfig(), job_task(JobConfig())
    folder = shipped.find("warmstart", cfg.as_dict(), cfg.presets())
    numerics = numerics_fingerprint((folder / "planner", folder / "subagent"))
    return cfg, task, folder, baseline_key(task, cfg, DEMO_EVAL_QUESTIONS, numerics)


def test_the_shipped_baseline_is_what_evaluating_the_shipped_warm_start_gives():
    """The demo's before-column comes from the shipped baseline of this processor's numerics: evaluating
    the shipped warm start here gives the same outcomes, every one (the same logits bit for bit, the
    same seeded draws). A changed evaluation (seed, temperature, agent format) fails it. Where none was
    shipped for these numerics and this processor model, the demo evaluates the warm start itself
    (another processor measured agreeing on 1,531 of 1,600 questions, 0.164 against 0.147:
    `mgrpo.workflows.demo_baseline`); here the test skips."""
    from mgrpo.workflows.demo_baseline import DEMO_EVAL_QUESTIONS, evaluate_heldout

    cfg, task, folder, key = _demo_baseline()
    entry = next(e for e in shipped.manifest()["warm_starts"] if e["folder"] == folder.name)
    assert entry.get("baselines"), "the demo's baseline is not shipped: mgrpo warmstart --ship-baseline"
    stored = shipped.baseline(folder, key)
    if stored is None:
        pytest.skip("no baseline shipped for this processor: mgrpo warmstart --ship-baseline ships one")
    here = evaluate_heldout(task, cfg, (folder / "planner", folder / "subagent"), DEMO_EVAL_QUESTIONS)
    same = sum(a == b for a, b in zip(stored["outcomes"], here["outcomes"], strict=True))
    assert same == DEMO_EVAL_QUESTIONS, f"{same} of {DEMO_EVAL_QUESTIONS} questions agree"
    assert stored["metrics"]["success"] == here["metrics"]["success"]


def test_the_numerics_fingerprint_sees_one_changed_bit(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from mgrpo.workflows.demo_baseline import numerics_fingerprint

    _, _, folder, _ = _demo_baseline()
    shutil.copytree(folder, tmp_path / "ws")
    pair = (tmp_path / "ws" / "planner", tmp_path / "ws" / "subagent")
    first = numerics_fingerprint(pair)
    assert numerics_fingerprint(pair) == first and len(first) == 12
    weights = load_file(pair[1] / "model.safetensors")
    name = next(k for k in weights if k.endswith("mlp.down_proj.weight"))
    w = weights[name]
    w.view(-1)[0] = torch.nextafter(w.view(-1)[0], torch.tensor(1.0))  # one ulp in the sub-agent
    save_file(weights, pair[1] / "model.safetensors", metadata={"format": "pt"})
    assert numerics_fingerprint(pair) != first


def test_the_numerics_fingerprint_sees_how_the_engine_samples(monkeypatch):
    """Same weights, same logits, another decoding path (the engine without its static cache, as a
    processor whose sampler rounds otherwise): another fingerprint. Logits alone were the same on two
    AMD EPYCs whose evaluations differed on 69 of 1,600 questions."""
    from mgrpo.workflows.demo_baseline import numerics_fingerprint

    _, _, folder, _ = _demo_baseline()
    pair = (folder / "planner", folder / "subagent")
    first = numerics_fingerprint(pair)
    monkeypatch.setenv("MGRPO_HF_STATIC_CACHE", "0")
    assert numerics_fingerprint(pair) != first


def test_another_evaluation_has_no_baseline_and_a_changed_one_is_an_error(tmp_path):
    from mgrpo.workflows.demo_baseline import baseline_key, numerics_fingerprint

    cfg, task, folder, key = _demo_baseline()
    numerics = numerics_fingerprint((folder / "planner", folder / "subagent"))
    assert shipped.baseline(folder, baseline_key(task, cfg, 400, numerics)) is None  # evaluated here
    assert shipped.baseline(folder, baseline_key(task, cfg, 1600, "0" * 12)) is None  # other numerics
    assert shipped.baseline(tmp_path, key) is None  # not a shipped folder
    root = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED, root)
    listed = next(e for e in shipped.manifest(root)["warm_starts"] if e["folder"] == folder.name)
    shipped_key, record = next(iter(listed["baselines"].items()))  # whichever processor shipped it
    path = root / record["file"]
    path.write_text(path.read_text().replace("1.0", "0.0", 1))
    with pytest.raises(shipped.StaleShippedError, match=r"baseline.*make warmstart"):
        shipped.baseline(root / folder.name, shipped_key, root)


def test_a_baseline_serves_only_the_processor_model_that_evaluated_it(tmp_path):
    """Two processor models may share a numerics fingerprint and still sample differently (an AMD EPYC
    family 25 model 1 and a model 17: 1,531 of 1,600 questions agree), so a baseline evaluated on
    another model is not used here, whatever its key."""
    built, root = tmp_path / "built", tmp_path / "root"
    built.mkdir()
    (built / "model.safetensors").write_bytes(b"weights")
    entry = shipped.ship("toy", {"seed": 7}, {}, built, root)
    shipped.ship_baseline(root / entry["folder"], "k", {"outcomes": [1.0]}, root)
    assert shipped.baseline(root / entry["folder"], "k", root)["outcomes"] == [1.0]
    data = shipped.manifest(root)
    record = data["warm_starts"][0]["baselines"]["k"]
    assert record["evaluated"]["processor"] == shipped._processor()
    for other in (shipped._processor() + " model 1", shipped._processor() + " "):
        record["evaluated"]["processor"] = other  # another model number; not even a near match
        (root / "manifest.json").write_text(json.dumps(data))
        assert shipped.baseline(root / entry["folder"], "k", root) is None, other


def test_a_rebuilt_warm_start_drops_the_baselines_of_the_old_bytes(tmp_path):
    built, root = tmp_path / "built", tmp_path / "root"
    built.mkdir()
    (built / "model.safetensors").write_bytes(b"weights")
    entry = shipped.ship("toy", {"seed": 7}, {}, built, root)
    listed = shipped.ship_baseline(root / entry["folder"], "k", {"outcomes": [1.0]}, root)
    assert shipped.baseline(root / entry["folder"], "k", root)["outcomes"] == [1.0]
    (built / "model.safetensors").write_bytes(b"other weights")
    entry = shipped.ship("toy", {"seed": 7}, {}, built, root)
    assert shipped.baseline(root / entry["folder"], "k", root) is None
    assert not (root / listed["file"]).exists()
    with pytest.raises(ValueError, match="not a shipped warm start"):
        shipped.ship_baseline(built, "k", {"outcomes": []}, root)


def test_ship_baseline_here_ships_this_machines_outcomes_under_its_numerics(monkeypatch, tmp_path):
    """`mgrpo warmstart --ship-baseline` on a copy of the shipped folder (32 questions, not the demo's
    1,600): the demo then finds a baseline under this machine's key, with this machine's processor."""
    from mgrpo.workflows import rebuild
    from mgrpo.workflows.demo_baseline import baseline_key, numerics_fingerprint

    cfg, task, folder, _ = _demo_baseline()
    root = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED, root)
    monkeypatch.setattr(rebuild, "DEMO_EVAL_QUESTIONS", 32)
    rebuild.ship_baseline_here(root)
    key = baseline_key(task, cfg, 32, numerics_fingerprint((folder / "planner", folder / "subagent")))
    stored = shipped.baseline(root / folder.name, key, root)
    assert stored is not None and len(stored["outcomes"]) == 32
    listed = next(e for e in shipped.manifest(root)["warm_starts"] if e["folder"] == folder.name)
    assert listed["baselines"][key]["evaluated"]["processor"] == shipped._processor()
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.json").write_text('{"warm_starts": []}')
    with pytest.raises(shipped.StaleShippedError, match="not shipped"):
        rebuild.ship_baseline_here(empty)
