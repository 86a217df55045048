"""The example plugin (`examples/lookup_plugin`) made importable and discoverable without installing
it: its package folder plus a `.dist-info` with the entry points its pyproject.toml declares, on a
path for sys.path / PYTHONPATH (what `pip install -e examples/lookup_plugin` gives)."""

from __future__ import annotations

import tomllib
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "examples" / "lookup_plugin"


def plugin_dist(where: Path) -> list[Path]:
    """Write the plugin's dist-info under `where`; returns the paths to put on the import path."""
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    dist = where / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    groups = project["entry-points"]
    (dist / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) for g, eps in groups.items())
    )
    return [where, PLUGIN]
