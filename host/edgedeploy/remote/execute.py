"""Executing plans on a device: push a bundle, roll back, enrol."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import Manifest, verify_bundle
from edgedeploy_agent.errors import AgentError

from ..errors import DeviceError, InputError
from ..inventory import Device
from .agent_client import AgentClient
from .facts import DeviceFacts, parse_facts
from .plan import Action, plan_push
from .transport import Progress, Transport


@dataclass
class PushResult:
    device: str
    outcome: str  # committed | unchanged | rolled-back | planned
    release: str
    previous: str | None
    actions: list[Action]
    timings: dict[str, float] = field(default_factory=dict)
    health: dict[str, Any] | None = None


def check_bundle(bundle: Path) -> Manifest:
    """Verify the bundle locally before anything is sent (hash of every artifact)."""
    try:
        return verify_bundle(bundle)
    except AgentError as e:
        raise InputError(e.message, hint=e.hint) from None


def get_facts(client: AgentClient) -> DeviceFacts:
    return parse_facts(client.call("facts", timeout=60))


def push(
    transport: Transport,
    device: Device,
    bundle: Path,
    *,
    dry_run: bool = False,
    force: bool = False,
    timeout: float = 60.0,
    progress: Progress | None = None,
    step: Callable[[str], None] = lambda s: None,
    build_timeout: float | None = None,
) -> PushResult:
    """Upload, deploy, health-check; with `build_timeout` the health check also waits for a TensorRT build."""
    timings: dict[str, float] = {}
    t = time.monotonic()
    manifest = check_bundle(bundle)
    timings["verify_local_s"] = round(time.monotonic() - t, 3)
    client = AgentClient(transport, device)
    step("facts")
    facts = get_facts(client)
    actions = plan_push(manifest, bundle.stat().st_size, device, facts, force=force)
    if dry_run:
        return PushResult(device.name, "planned", manifest.release_name, facts.current_release, actions, timings)
    if all(a.noop for a in actions):
        return PushResult(device.name, "unchanged", manifest.release_name, facts.current_release, actions, timings)

    remote = f"{device.root}/incoming/{manifest.release_name}.edb"
    step("upload")
    t = time.monotonic()
    transport.put(bundle, remote, progress=progress)
    timings["upload_s"] = round(time.monotonic() - t, 3)
    step("deploy")
    t = time.monotonic()
    args = ["deploy", remote, "--timeout", str(timeout)]
    if device.source is not None:
        args += ["--source", device.source]
    if force:
        args.append("--force")
    if build_timeout is not None:
        args += ["--build-timeout", str(build_timeout)]
    try:
        result = client.call(*args, timeout=max(timeout, build_timeout or 0) * 2 + 120)
    except DeviceError as e:
        if e.code == "health-check-failed":
            e.message = f"{e.message} (rolled back automatically)"
        raise
    timings["deploy_s"] = round(time.monotonic() - t, 3)
    timings.update({f"device_{k}": v for k, v in (result.get("timings") or {}).items()})
    return PushResult(
        device.name,
        result["outcome"],
        result["release"],
        result.get("previous"),
        actions,
        timings,
        health=result.get("health"),
    )


def rollback(transport: Transport, device: Device, timeout: float = 60.0) -> dict[str, Any]:
    return AgentClient(transport, device).call("rollback", "--timeout", str(timeout), timeout=timeout * 2 + 60)


def init_agent(transport: Transport, device: Device) -> dict[str, Any]:
    args = ["init", "--device-name", device.name, "--service", device.service]
    if device.source:
        args += ["--source", device.source]
    return AgentClient(transport, device).call(*args, timeout=60)
