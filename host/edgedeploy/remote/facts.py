"""Device facts: what `edgedeploy-agent facts` says, parsed into a value the planner can use."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


def parse_facts(data: dict[str, Any]) -> DeviceFacts:
    """Pure: the agent's facts JSON -> DeviceFacts."""
    current = data.get("current") or {}
    health = data.get("health") or {}
    healthy = health.get("release") if health.get("state") in ("ready", "finished") else None
    return DeviceFacts(
        agent_version=str(data.get("agent_version", "?")),
        bundle_schema=int(data.get("bundle_schema", 0)),
        arch=str(data.get("arch", "?")),
        python=str(data.get("python", "?")),
        initialised=bool(data.get("initialised")),
        free_bytes=data.get("free_bytes"),
        current_release=current.get("release"),
        current_bundle_id=current.get("bundle_id"),
        running=bool(data.get("running")),
        healthy_release=healthy,
        health_state=health.get("state"),
        previous=tuple(data.get("previous") or ()),
        pending_state=(data.get("pending") or {}).get("state"),
    )
