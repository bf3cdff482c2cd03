"""Executing plans on a device: push a bundle, roll back, enrol."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceError, EdgeDeployError
from ..inventory import Device
from .agent_client import AgentClient
from .blobs import BundleBlobs
from .facts import DeviceFacts, parse_facts
from .plan import Action, plan_push
from .transport import Progress, Transport


@dataclass
class PushResult:
    device: str
    outcome: str  # committed | unchanged | planned
    release: str
    previous: str | None
    actions: list[Action]
    timings: dict[str, float] = field(default_factory=dict)
    health: dict[str, Any] | None = None
    uploaded_bytes: int = 0


@dataclass(frozen=True)
class HealthPolicy:
    """What the device must show after activation before the new bundle is committed."""

    timeout: float = 60.0
    min_inferences: int = 0
    max_p95_ms: float | None = None
    min_fps: float | None = None
    build_timeout: float | None = None  # TensorRT: also wait this long for an engine built at activation

    def agent_args(self) -> list[str]:
        args = ["--timeout", str(self.timeout)]
        if self.build_timeout is not None:
            args += ["--build-timeout", str(self.build_timeout)]
        if self.min_inferences:
            args += ["--min-inferences", str(self.min_inferences)]
        if self.max_p95_ms is not None:
            args += ["--max-p95-ms", str(self.max_p95_ms)]
        if self.min_fps is not None:
            args += ["--min-fps", str(self.min_fps)]
        return args


def get_facts(client: AgentClient) -> DeviceFacts:
    return parse_facts(client.call("facts", timeout=60))


def push(
    transport: Transport,
    device: Device,
    blobs: BundleBlobs,
    *,
    dry_run: bool = False,
    force: bool = False,
    health: HealthPolicy = HealthPolicy(),
    progress: Progress | None = None,
    step: Callable[[str], None] = lambda s: None,
) -> PushResult:
    """facts -> plan -> upload the missing blobs -> deploy (verify, activate, health-check) on the device."""
    timings: dict[str, float] = {}
    manifest = blobs.manifest
    client = AgentClient(transport, device)
    step("facts")
    # one round trip: the device's facts and which blobs it lacks (it verifies finished uploads meanwhile)
    raw = client.call("facts", "--blobs", *[b.sha256 for b in blobs.blobs], timeout=300)
    facts = parse_facts(raw)
    lacking = set((raw.get("blobs") or {}).get("missing", [b.sha256 for b in blobs.blobs]))
    missing = [b for b in blobs.blobs if b.sha256 in lacking]
    upload_bytes = sum(b.size for b in missing)
    actions = plan_push(
        manifest, upload_bytes, device, facts, force=force, missing_blobs=(len(missing), len(blobs.blobs))
    )
    if dry_run:
        return PushResult(device.name, "planned", manifest.release_name, facts.current_release, actions, timings)
    if all(a.noop for a in actions):
        return PushResult(device.name, "unchanged", manifest.release_name, facts.current_release, actions, timings)

    step(f"upload {len(missing)} blobs, {upload_bytes / 1e6:.1f} MB")
    t = time.monotonic()
    sent = 0
    for b in missing:
        done_before = sent

        def each(done: int, total: int, base: int = done_before) -> None:
            if progress:
                progress(base + done, upload_bytes)

        transport.put(b.local, f"{device.root}/blobs/incoming/{b.sha256}", progress=each)
        sent += b.size
    timings["upload_s"] = round(time.monotonic() - t, 3)
    step("deploy")
    t = time.monotonic()
    args = ["deploy", "--manifest-blob", blobs.manifest_sha, *health.agent_args()]
    if blobs.signature_sha:
        args += ["--signature-blob", blobs.signature_sha]
    if device.source is not None:
        args += ["--source", device.source]
    if force:
        args.append("--force")
    try:
        result = client.call(*args, timeout=max(health.timeout, health.build_timeout or 0) * 2 + 120)
    except DeviceError as e:
        if e.code == "health-check-failed":
            e.message = f"{e.message} (rolled back automatically)"
        if e.code == "agent-killed":
            e.message = f"{e.message}; {_read_back(client)}"
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
        uploaded_bytes=upload_bytes,
    )


def _read_back(client: AgentClient) -> str:
    """The device's state after an interrupted deploy: asking for facts makes it recover first."""
    try:
        f = get_facts(client)
    except EdgeDeployError as e:
        return f"its state could not be read back ({e.message})"
    return f"read back: the device is on {f.current_release or 'no bundle'} (agent {f.health_state or 'not started'})"


def rollback(transport: Transport, device: Device, timeout: float = 60.0) -> dict[str, Any]:
    return AgentClient(transport, device).call("rollback", "--timeout", str(timeout), timeout=timeout * 2 + 60)


def init_agent(transport: Transport, device: Device) -> dict[str, Any]:
    args = ["init", "--device-name", device.name, "--service", device.service, "--profile", device.profile]
    args += ["--keep-releases", str(device.keep_releases)]
    if device.source:
        args += ["--source", device.source]
    return AgentClient(transport, device).call(*args, timeout=60)


def install_keys(transport: Transport, device: Device, public_keys: list[str]) -> list[str]:
    """Pin exactly these signing keys on the device; from then on it runs signed bundles only."""
    return list(AgentClient(transport, device).call("trust", "--set", *public_keys, timeout=60)["trusted_keys"])
