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


# ---- inside mgrpo: layers, no cycles (docs/architecture.md, "The core's layers") ----------------------
# Bottom to top; a module belongs to the first layer whose prefix names it. A module may import only
# modules of its own layer or of lower ones.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "records and math",
        (
            "mgrpo.records",
            "mgrpo.algo",
            "mgrpo.advantages",
            "mgrpo.presets",
            "mgrpo.config",
            "mgrpo.role_config",
            "mgrpo.timing",
            "mgrpo.tracing",
            "mgrpo.reproducibility",
            "mgrpo.datasets",
            "mgrpo.programs",
            "mgrpo.retention",
            "mgrpo",  # the package itself: its version and the CPU numerics pin
        ),
    ),
    (
        "models and training",
        (
            "mgrpo.models",
            "mgrpo.lora",
            "mgrpo.checkpoint",
            "mgrpo.batching",
            "mgrpo.shared_prefix",
            "mgrpo.training",
            "mgrpo.parallel",
        ),
    ),
    ("engines", ("mgrpo.engines",)),
    (
        "agents, tasks, tools, rewards",
        ("mgrpo.agents", "mgrpo.tasks", "mgrpo.tools", "mgrpo.judge", "mgrpo.scoring", "mgrpo.evaluation"),
    ),
    ("workflows", ("mgrpo.workflows",)),
    ("runtime and role set-up", ("mgrpo.runtime", "mgrpo.role_model", "mgrpo.tracking")),
)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The index of the module's layer (its longest matching prefix)."""
    best = max(
        (
            (len(p), i)
            for i, (_, prefixes) in enumerate(LAYERS)
            for p in prefixes
            if module == p or module.startswith(p + ".")
        ),
        default=None,
    )
    assert best is not None, f"{module} is in no layer of tests/test_architecture.py LAYERS: give it one"
    return best[1]


def imports_of(tree: ast.AST) -> list[tuple[str, int, bool]]:
    """Every absolute import in a module: (dotted name, line, inside a function), names of `from`
    imports joined to their module (`a.b.c` for `from a.b import c`), TYPE_CHECKING ones included."""
    out: list[tuple[str, int, bool]] = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                out += [(a.name, child.lineno, inner) for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                out += [(f"{child.module}.{a.name}", child.lineno, inner) for a in child.names]
            stack.append((child, inner))
    return out


def core_imports(root: Path = ROOT) -> dict[str, list[tuple[str, int, bool]]]:
    """Each mgrpo module's imports of mgrpo modules: (target module, line, at function level)."""
    modules = {module_name(p, root): p for p in (root / "mgrpo").rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    out: dict[str, list[tuple[str, int, bool]]] = {}
    for name, path in modules.items():
        found = [(resolve(t), line, fn) for t, line, fn in imports_of(ast.parse(path.read_text(), str(path)))]
        out[name] = [
            (t, line, fn) for t, line, fn in found if t is not None and t != name and t.startswith("mgrpo")
        ]
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module: a module is in one when a module it
    imports (directly or not) imports it back."""
    reach = {v: _reachable(graph, v) for v in graph}
    found = {tuple(sorted(w for w in reach[v] if v in reach.get(w, set()))) for v in graph if v in reach[v]}
    return sorted(list(c) for c in found if len(c) > 1)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo += graph.get(v, ())
    return seen


def test_the_core_has_no_import_cycle():
    graph = {m: {t for t, _, _ in targets} for m, targets in core_imports().items()}
    assert not cycles(graph), f"import cycles inside mgrpo (docs/architecture.md): {cycles(graph)}"


def test_the_core_imports_run_down_its_layers():
    up = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]}) on line {line}"
        for m, targets in core_imports().items()
        for t, line, _ in targets
        if layer_of(t) > layer_of(m)
    ]
    assert not up, "imports from a lower layer to a higher one (docs/architecture.md):\n" + "\n".join(up)


def test_the_core_imports_itself_at_module_level():
    """Function-level imports are for optional heavy dependencies only (with a comment saying so), never
    for a module of mgrpo: one that needs hiding is a cycle or a layer break."""
    hidden = [
        f"{m} imports {t} inside a function (line {line})"
        for m, ts in core_imports().items()
        for t, line, fn in ts
        if fn
    ]
    assert not hidden, "\n".join(hidden)


def test_function_level_imports_say_why():
    """Every import inside a function carries a comment on its line or the line above, in every
    package but the command line's modules, whose commands import what they run (services/cli_base.py
    says so once: `mgrpo --help` starts without torch)."""
    silent = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name.startswith("cli"):
                continue
            lines = path.read_text().splitlines()
            for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
                if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import | ast.ImportFrom) and not _commented(
                        lines, node.lineno - 1
                    ):
                        silent.append(
                            f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                        )
    assert not silent, "function-level imports without a comment saying why:\n" + "\n".join(
        sorted(set(silent))
    )


def _commented(lines: list[str], i: int) -> bool:
    """Line i has a comment, or the block of imports it ends sits under one."""
    if "#" in lines[i]:
        return True
    while i > 0 and lines[i - 1].strip().startswith(("from ", "import ")):
        i -= 1
    return i > 0 and lines[i - 1].strip().startswith("#")


def test_a_planted_cycle_and_a_planted_upward_import_are_found(tmp_path):
    """The two checks above on a copy of the core with one bad import added each time."""
    import shutil

    shutil.copytree(ROOT / "mgrpo", tmp_path / "mgrpo")
    records = tmp_path / "mgrpo" / "records.py"
    records.write_text(records.read_text() + "\nfrom mgrpo.role_model import RoleModel  # planted\n")
    graph = {m: {t for t, _, _ in ts} for m, ts in core_imports(tmp_path).items()}
    assert any("mgrpo.records" in c and "mgrpo.role_model" in c for c in cycles(graph))
    assert layer_of("mgrpo.role_model") > layer_of("mgrpo.records")  # so it is an upward import too


SERVICE_ENV = ("environ", "getenv", "putenv", "get_settings")


def test_no_service_module_touches_the_environment_at_import():
    """Services are built by a factory from `Settings` (`create_app(role, settings)`): no module-level
    statement of services/ reads or writes the environment."""
    touching = []
    for path in (ROOT / "services").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for stmt in tree.body:
            if isinstance(
                stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Import | ast.ImportFrom
            ):
                continue
            names = {n.attr for n in ast.walk(stmt) if isinstance(n, ast.Attribute)} | {
                n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
            }
            if names & set(SERVICE_ENV):
                touching.append(f"{path.relative_to(ROOT)}:{stmt.lineno}")
    assert not touching, f"module-level environment access in services/: {touching}"


def lines_matching(pattern: str, but: str) -> list[str]:
    """`path:line: text` of every line of the service packages matching `pattern`, but in file `but`."""
    import re

    compare = re.compile(pattern)
    return [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for package in ("mgrpo", "planner_trainer", "subagent_trainer", "services")
        for path in (ROOT / package).rglob("*.py")
        if path.relative_to(ROOT).as_posix() != but
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if compare.search(line)
    ]


def test_no_code_outside_the_workflow_table_compares_workflow_names():
    """What differs between workflows lives in their declarations (mgrpo/workflows/table.py)."""
    found = lines_matching(r"(workflow|engine) *(==|!=|in) ", but="mgrpo/workflows/table.py")
    assert not found, "\n".join(found)


def test_no_code_outside_the_backend_table_compares_backend_names():
    """What differs between the fsdp and megatron backends lives in their declarations
    (mgrpo/parallel/backends.py): no `backend == "megatron"` anywhere else."""
    found = lines_matching(r"""(==|!=|\bin) *\(?["'](fsdp|megatron)["']""", but="mgrpo/parallel/backends.py")
    assert not found, "\n".join(found)
