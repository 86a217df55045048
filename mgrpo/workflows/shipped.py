"""Shipped warm starts: the default warm starts of the built-in workflows as files in the package
(`mgrpo/shipped/`), so that every machine starts from the same bytes and a first `make demo` skips
4–8 minutes of SFT.

Why: a warm start built here is reproducible on one processor vendor, not across vendors (MKL honours
the pinned AVX2 path on Intel only; `mgrpo/reproducibility.py`), and the demo's gain depended on which
warm start RL started from. `mgrpo/shipped/manifest.json` lists each shipped folder with the warm
start's kind and config, its recipe key (the config, `RECIPE_VERSIONS` and the presets: no library
versions, which change nothing in a saved model's bytes), the sha256 of every file, and how it was
built (command, code version, libraries, processor, date).

`find(kind, config, presets)` gives a shipped folder for exactly this warm start, its files checked;
none when nothing is shipped for this config (another seed or step count builds as before). When one
is shipped for this config but by another recipe (a generator's code changed, its version bumped),
or its files do not match the manifest, it raises `StaleShippedError` saying to rebuild with
`make warmstart` (`mgrpo warmstart --rebuild`), which builds them again and rewrites the manifest:
never a silent rebuild of minutes, never a silently different start.

A shipped warm start may carry **baselines**: its held-out outcomes under one evaluation (questions,
seed, temperature: the evaluation's `key`), evaluated once where it was built, so that a demo compares
its trained models against them instead of evaluating the same bytes again on every machine (a minute
of the deep-research demo's six). Each is a file in `baselines/` whose sha256 the manifest entry
lists under `baselines`, with where and when it was evaluated; it serves only that processor model.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any

from mgrpo.reproducibility import RECIPE_VERSIONS, environment

SHIPPED = Path(__file__).resolve().parents[1] / "shipped"
MANIFEST = "manifest.json"
REBUILD = "make warmstart (or .venv/bin/mgrpo warmstart --rebuild)"


class StaleShippedError(RuntimeError):
    """A shipped warm start that is not what the code would build: rebuild it (`REBUILD`)."""


def recipe_key(config: dict[str, Any], presets: dict[str, Any]) -> str:
    """12 hex digits over the config, `RECIPE_VERSIONS` and the presets it names."""
    blob = json.dumps({"config": config, "recipe": RECIPE_VERSIONS, "presets": presets}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file below `folder`, by its relative path."""
    return {p.relative_to(folder).as_posix(): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def manifest(root: Path = SHIPPED) -> dict[str, Any]:
    path = root / MANIFEST
    return json.loads(path.read_text()) if path.exists() else {"warm_starts": []}


@cache
def _verified(folder: Path, files: tuple[tuple[str, str], ...]) -> None:
    """Every file of a shipped folder matches the manifest (checked once per process)."""
    actual = file_digests(folder)
    wrong = sorted(name for name, sha in files if actual.get(name) != sha)
    extra = sorted(set(actual) - {name for name, _ in files})
    if wrong or extra:
        raise StaleShippedError(
            f"the shipped warm start {folder} does not match its manifest ({', '.join(wrong + extra)[:200]}): "
            f"restore it from git, or rebuild it with {REBUILD}"
        )


def find(kind: str, config: dict[str, Any], presets: dict[str, Any], root: Path = SHIPPED) -> Path | None:
    """The shipped folder of this warm start (module docstring)."""
    for entry in manifest(root)["warm_starts"]:
        if entry["kind"] != kind or entry["config"] != config:
            continue
        if entry["recipe_key"] != recipe_key(config, presets):
            raise StaleShippedError(
                f"the shipped {kind} warm start was built by another recipe than this code's (a generator, "
                f"the SFT recipe or a preset changed: recipe key {entry['recipe_key']} shipped, "
                f"{recipe_key(config, presets)} now): rebuild it with {REBUILD} and commit mgrpo/shipped/"
            )
        folder = root / entry["folder"]
        _verified(folder, tuple(sorted(entry["files"].items())))
        return folder
    return None


def fingerprint(files: dict[str, str]) -> str:
    """One sha256 over a folder's `sha256  name` lines (what `sha256sum` prints, sorted by name): the
    same on every machine that holds the same bytes."""
    lines = "".join(f"{sha}  {name}\n" for name, sha in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def provenance(folder: Path, root: Path = SHIPPED) -> str | None:
    """How a shipped folder was made and its fingerprint, in one line; None for a folder not shipped."""
    entry = _entry(folder, root)
    if entry is None:
        return None
    b = entry["built"]
    return (
        f"sha256 {fingerprint(entry['files'])[:16]} (all {len(entry['files'])} files; "
        f"built {b['date']} on {b['processor']} at {b['code']} by make warmstart)"
    )


BASELINES = "baselines"


def _entry(folder: Path, root: Path, data: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The manifest entry (of `data`, else of the manifest on disk) of a shipped folder."""
    for entry in (manifest(root) if data is None else data)["warm_starts"]:
        if (root / entry["folder"]).resolve() == Path(folder).resolve():
            return entry
    return None


def _write_manifest(data: dict[str, Any], root: Path) -> None:
    (root / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def baseline(folder: Path, key: str, root: Path = SHIPPED) -> dict[str, Any] | None:
    """The shipped baseline of a shipped warm start under evaluation `key` (module docstring), its
    sha256 checked; None when `folder` is not shipped, has no baseline for `key`, or has one that
    another processor model evaluated. The key holds the numerics fingerprint, but two processors may
    share a fingerprint and still sample differently: an AMD EPYC family 25 model 1 and a model 17
    did, agreeing on 1,531 of the demo's 1,600 questions (2026-12-07), so a baseline serves only the
    processor model that evaluated it (`_processor`), and any other evaluates the warm start itself."""
    entry = _entry(folder, root)
    listed = None if entry is None else entry.get("baselines", {}).get(key)
    if listed is None:
        return None
    path = root / listed["file"]
    if not path.exists() or digest(path) != listed["sha256"]:
        raise StaleShippedError(
            f"the shipped baseline {path} does not match its manifest: restore it from git, or rebuild "
            f"it with {REBUILD}"
        )
    if listed["evaluated"]["processor"] != _processor():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return {**data, "evaluated": listed["evaluated"]}


def ship_baseline(folder: Path, key: str, data: dict[str, Any], root: Path = SHIPPED) -> dict[str, Any]:
    """Store `data` (JSON) as the baseline of the shipped warm start `folder` under `key` and list it in
    the manifest; returns its manifest record."""
    (root / BASELINES).mkdir(exist_ok=True)
    name = f"{BASELINES}/{Path(folder).name}-{key}.json"
    (root / name).write_text(json.dumps(data, sort_keys=True) + "\n")
    listed = {
        "file": name,
        "sha256": digest(root / name),
        "evaluated": {"code": _commit(), "processor": _processor(), "date": time.strftime("%Y-%m-%d")},
    }
    data = manifest(root)
    entry = _entry(folder, root, data)
    if entry is None:
        raise ValueError(f"{folder} is not a shipped warm start: ship it first (`ship`)")
    entry.setdefault("baselines", {})[key] = listed
    _write_manifest(data, root)
    return listed


def ship(
    kind: str, config: dict[str, Any], presets: dict[str, Any], built: Path, root: Path = SHIPPED
) -> dict[str, Any]:
    """Copy a built warm start into the shipped folder and record it in the manifest (replacing the
    entry of the same kind and config)."""
    name = f"{kind}-{recipe_key(config, presets)}"
    target = root / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(built, target)
    entry = {
        "kind": kind,
        "folder": name,
        "config": config,
        "recipe_key": recipe_key(config, presets),
        "files": file_digests(target),
        "built": {
            "command": REBUILD,
            "code": _commit(),
            "environment": environment(),
            "processor": _processor(),
            "date": time.strftime("%Y-%m-%d"),
        },
    }
    data = manifest(root)
    old = [e for e in data["warm_starts"] if e["kind"] == kind and e["config"] == config]
    for e in old:  # its baselines go with it: they were evaluated on the old bytes
        if e["folder"] != name:
            shutil.rmtree(root / e["folder"], ignore_errors=True)
        for listed in e.get("baselines", {}).values():
            (root / listed["file"]).unlink(missing_ok=True)
    data["warm_starts"] = [e for e in data["warm_starts"] if e not in old] + [entry]
    _write_manifest(data, root)
    _verified.cache_clear()
    return entry


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=SHIPPED.parent
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _processor() -> str:
    """The model name, and family and model numbers (one name covers several generations)."""
    try:
        info = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in Path("/proc/cpuinfo").read_text().splitlines())
        )
    except OSError:
        return platform.processor() or platform.machine()
    name = info.get("model name") or platform.processor() or platform.machine()
    return f"{name} (family {info['cpu family']} model {info['model']})" if "cpu family" in info else name
