"""Device facts: what `edgedeploy-agent facts` says, parsed into a value the planner can use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from edgedeploy_agent.facts import Facts

from ..errors import DeviceError, validation_text


@dataclass(frozen=True)
class DeviceFacts:
    agent_version: str
    bundle_schema: int
    arch: str
    python: str
    initialised: bool
    free_bytes: int | None
    current_release: str | None
    current_bundle_id: str | None
    running: bool
    healthy_release: str | None
    health_state: str | None
    previous: tuple[str, ...]
    pending_state: str | None  # the state of a transition in flight or interrupted (None: none)
    model: str = "default"  # the model slot the fields above describe (`facts --model`)
    models: dict[str, ModelFacts] = field(default_factory=dict)  # every model slot on the device


@dataclass(frozen=True)
class ModelFacts:
    """One model slot of a device, in short."""

    source: str | None
    running: bool | None
    current_release: str | None
    health_state: str | None
    pending_state: str | None


def parse_facts(data: dict[str, Any], device: str = "device") -> DeviceFacts:
    """Pure: the agent's facts JSON, validated against its one definition (edgedeploy_agent.facts) ->
    DeviceFacts. A key the host does not know, or one missing, is the agent's and host's versions differing."""
    try:
        f = Facts.model_validate({k: v for k, v in data.items() if k != "ok"})
    except ValidationError as e:
        raise DeviceError(
            f"{device}: the agent's facts are not in the format this host reads ({validation_text(e)})",
            hint="install the agent that matches this edgedeploy (`edgedeploy agent install DEVICE`)",
            code="agent-mismatch",
        ) from None
    health = f.health or {}
    healthy = health.get("release") if health.get("state") in ("ready", "finished") else None
    return DeviceFacts(
        agent_version=f.agent_version,
        bundle_schema=f.bundle_schema,
        arch=f.arch,
        python=f.python,
        initialised=f.initialised,
        free_bytes=f.free_bytes,
        current_release=f.current.release if f.current else None,
        current_bundle_id=f.current.bundle_id if f.current else None,
        running=bool(f.running),
        healthy_release=healthy,
        health_state=health.get("state"),
        previous=tuple(f.previous),
        pending_state=(f.pending or {}).get("state"),
        model=f.slot or "default",
        models={
            slot: ModelFacts(
                m.source,
                m.running,
                m.current.release if m.current else None,
                (m.health or {}).get("state"),
                (m.pending or {}).get("state"),
            )
            for slot, m in (f.models or {}).items()
        },
    )
