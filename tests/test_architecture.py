"""Architecture rules from ARCHITECTURE.md, checked on the source text (AST imports, key literals)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["mgrpo", "shared_store", "planner_trainer", "subagent_trainer", "services"]


def imported_roots(package: str) -> dict[str, set[str]]:
    """Map each module file of a package to the top-level names it imports."""
    out: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


FORBIDDEN = {
    "mgrpo": {
        "redis",
        "fastapi",
        "uvicorn",
        "shared_store",
        "planner_trainer",
        "subagent_trainer",
        "services",
    },
    "shared_store": {
        "torch",
        "transformers",
        "mgrpo",
        "planner_trainer",
        "subagent_trainer",
        "services",
        "fastapi",
    },
    "planner_trainer": {"subagent_trainer", "services"},
    "subagent_trainer": {"planner_trainer", "services"},
}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package: str) -> None:
    bad = {
        f: sorted(n & FORBIDDEN[package])
        for f, n in imported_roots(package).items()
        if n & FORBIDDEN[package]
    }
    assert not bad, f"{package} must not import these (see ARCHITECTURE.md, Layout): {bad}"


def test_math_imports_only_torch_numpy_and_stdlib() -> None:
    allowed = {
        "torch",
        "numpy",
        "mgrpo",
        "__future__",
        "collections",
        "typing",
        "math",
        "re",
        "string",
        "hashlib",
    }
    for f, names in imported_roots("mgrpo").items():
        if "/algo/" in f:
            assert names <= allowed, f"{f} imports {sorted(names - allowed)}: the math stays pure"


def test_nothing_imports_the_cli() -> None:
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom):
                    names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                assert "services.cli" not in names, f"{path} imports the CLI"


def test_redis_key_literals_live_only_in_keys_module() -> None:
    offenders = []
    for package in [*PACKAGES, "bench"]:
        for path in (ROOT / package).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() != "shared_store/keys.py" and "mgrpo:v1" in path.read_text():
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"Redis key literals outside shared_store/keys.py: {offenders}"
