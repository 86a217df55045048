"""docs/configuration.md is what `mgrpo schema --markdown` prints now: a field or setting added,
removed or redocumented without regenerating it fails here (the fix: run the command)."""

from __future__ import annotations

from pathlib import Path

from services.config_docs import configuration_markdown

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_configuration_page_is_current():
    assert PAGE.read_text() == configuration_markdown(), (
        "docs/configuration.md is stale: run `mgrpo schema --markdown > docs/configuration.md`"
    )


def test_the_page_names_every_field_and_setting():
    from mgrpo.config import JobConfig
    from services.settings import Settings

    page = configuration_markdown()
    schema = JobConfig.model_json_schema()
    models = [schema, *schema["$defs"].values()]
    assert all(f"| `{field}` |" in page for m in models for field in m.get("properties", {}))
    assert all(f"MGRPO_{name.upper()}" in page for name in Settings.model_fields if name != "redis_url")
