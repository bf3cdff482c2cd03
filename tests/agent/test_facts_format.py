"""The facts wire format (edgedeploy_agent.facts) against what a real agent prints, and the captured
fixture the host's parser is tested on (tests/agent/fixtures/facts.json) kept current: regenerate it with
EDGEDEPLOY_UPDATE_FIXTURES=1 when the format changes on purpose."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.facts import Facts
from edgedeploy_agent.lifecycle import Deployment
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import copy, make_bundle
from tests.agent.doubles import ScriptedService
from tests.helpers import agent

FIXTURE = Path(__file__).parent / "fixtures" / "facts.json"


def _shape(value: Any) -> Any:
    """The keys (recursively) and value types of a JSON document, without its values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


def _captured(tmp_path: Path) -> dict[str, Any]:
    """`facts --blobs` of a device with one committed release, from the real agent command."""
    store = DeviceStore(tmp_path / "device")
    store.init(AgentConfig(device_name="cam-01", profile="cpu-x86_64"))
    bundle = make_bundle(tmp_path / "v1", version="1")
    Deployment(store, ScriptedService(store)).deploy(copy(bundle, store.incoming), timeout=2)
    sha = read_manifest(bundle).artifacts[0].sha256
    r = agent("--root", str(store.root), "--json", "facts", "--blobs", sha, "f" * 64)
    assert r.code == 0, r.err
    data: dict[str, Any] = json.loads(r.out)
    return data


def test_the_agent_prints_the_format_and_the_fixture_is_current(tmp_path: Path) -> None:
    data = _captured(tmp_path)
    assert data.pop("ok") is True
    Facts.model_validate(data)  # what the host validates
    assert data["current"]["release"] and "f" * 64 in data["blobs"]["missing"] and data["health"]["state"]
    if os.environ.get("EDGEDEPLOY_UPDATE_FIXTURES") == "1":
        FIXTURE.write_text(json.dumps({"ok": True, **data}, indent=1) + "\n", encoding="utf-8")
    fixture = json.loads(FIXTURE.read_text(encoding="utf-8"))
    fixture.pop("ok")
    assert _shape(fixture) == _shape(data), "tests/agent/fixtures/facts.json is stale: EDGEDEPLOY_UPDATE_FIXTURES=1"
