"""The wheel carries every package: setuptools installs only the packages pyproject.toml lists, so a new folder
that is not listed works in this editable checkout and is missing on every device (it happened: sidecar/)."""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_every_python_package_of_host_and_agent_is_in_the_wheel() -> None:
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    dirs = {name: REPO / folder for name, folder in tool["package-dir"].items()}
    found = set()
    for top in ("edgedeploy", "edgedeploy_agent"):
        for init in dirs[top].rglob("__init__.py"):
            rel = init.parent.relative_to(dirs[top])
            found.add(".".join((top, *rel.parts)))
    assert found <= listed, f"packages missing from pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"
