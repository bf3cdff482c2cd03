"""Health objectives carried by the bundle: absent ones leave the bundle id alone, present ones are enforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy_agent.bundle import HealthSpec, read_manifest, read_signed_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import HealthCheckFailed
from edgedeploy_agent.lifecycle import Deployment
from edgedeploy_agent.service import HealthObjectives
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import copy, make_bundle
from tests.agent.doubles import ScriptedService


def test_no_objectives_serialise_as_before(tmp_path: Path) -> None:
    m, body, _ = read_signed_manifest(make_bundle(tmp_path / "a"))
    assert m.health is None and b"health" not in body and body == m.canonical_bytes()
    with_spec = m.model_copy(update={"health": HealthSpec(min_inferences=3)})
    assert b'"health":{"max_p95_ms":null,"min_fps":null,"min_inferences":3}' in with_spec.canonical_bytes()


def test_command_line_overrides_the_bundle() -> None:
    spec = HealthSpec(min_inferences=10, max_p95_ms=5.0, min_fps=20.0)
    merged = HealthObjectives(3, max_p95_ms=2.0).with_bundle(spec)
    assert (merged.min_inferences, merged.max_p95_ms, merged.min_fps) == (10, 2.0, 20.0)
    with pytest.raises(RuntimeError, match="above the objective"):
        merged.judge({"state": "ready", "inferences": 10, "infer_p95_ms": 3.0, "fps": 30.0})
    assert merged.judge({"state": "ready", "inferences": 9, "infer_p95_ms": 1.0, "fps": 30.0}) is None
    assert merged.judge({"state": "ready", "inferences": 10, "infer_p95_ms": 1.0, "fps": 30.0}) is True


def test_bundle_objectives_roll_back_an_agent_that_never_infers(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path / "device")
    store.init(AgentConfig(device_name="t"))
    svc = ScriptedService(store)  # reports ready, never runs an inference
    good = make_bundle(tmp_path / "v1", version="1")
    Deployment(store, svc).deploy(copy(good, store.incoming), timeout=2)
    strict = make_bundle(tmp_path / "v2", version="2", health=HealthSpec(min_inferences=5))
    with pytest.raises(HealthCheckFailed, match="ready, but 0 of 5 required inferences"):
        Deployment(store, svc).deploy(copy(strict, store.incoming), timeout=1)
    assert store.current() == read_manifest(good).release_name
