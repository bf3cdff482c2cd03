"""docs/architecture.md's module map names every module of both packages (the map matches the code)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_module_is_in_the_map() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = doc.split("## Module map", 1)[1].split("\n## ", 1)[0]
    missing = [
        str(p.relative_to(REPO))
        for root in (REPO / "host" / "edgedeploy", REPO / "agent" / "edgedeploy_agent")
        for p in sorted(root.rglob("*.py"))
        if p.name != "__init__.py" and f"{p.name}`" not in section
    ]
    assert not missing, f"docs/architecture.md#module-map does not name: {', '.join(missing)}"
