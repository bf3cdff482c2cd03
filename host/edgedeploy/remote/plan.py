"""The pure push planner: (manifest, device, profile, facts) -> actions. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass

from edgedeploy_agent.bundle import Manifest

from ..errors import DeviceError, InputError
from ..inventory import Device
from .facts import DeviceFacts

SPACE_MARGIN = 32 << 20


@dataclass(frozen=True)
class Action:
    kind: str  # "upload" | "deploy"
    detail: str
    noop: bool = False


def plan_push(
    manifest: Manifest, bundle_size: int, device: Device, facts: DeviceFacts, force: bool = False
) -> list[Action]:
    """Check the bundle fits the device, then list what must happen. Raises on anything that cannot work."""
    if manifest.profile != device.profile:
        raise InputError(
            f"bundle is for profile {manifest.profile}, device {device.name} is {device.profile}",
            hint=f"build it with --profile {device.profile}",
        )
    if not facts.initialised:
        raise DeviceError(
            f"{device.name}: agent root {device.root} is not initialised",
            hint=f"run `edgedeploy devices enroll {device.name}`",
            code="not-initialised",
        )
    if manifest.target.arch != facts.arch:
        raise DeviceError(
            f"{device.name} reports arch {facts.arch}, bundle is for {manifest.target.arch}", code="incompatible-bundle"
        )
    if manifest.schema_version > facts.bundle_schema:
        raise DeviceError(
            f"{device.name}: agent {facts.agent_version} reads bundle schema {facts.bundle_schema}, "
            f"bundle is schema {manifest.schema_version}",
            hint="upgrade the agent",
            code="incompatible-bundle",
        )
    unpacked = sum(a.size for a in manifest.artifacts)
    needed = bundle_size + unpacked + SPACE_MARGIN
    if facts.free_bytes is not None and facts.free_bytes < needed:
        raise DeviceError(
            f"{device.name}: not enough disk: {facts.free_bytes >> 20} MiB free, "
            f"{needed >> 20} MiB needed (bundle + unpacked + margin)",
            hint="free space on the device (old releases are pruned automatically)",
            code="no-space",
        )
    running = (
        facts.current_release == manifest.release_name
        and facts.running
        and facts.healthy_release == manifest.release_name
    )
    if running and not force:
        return [
            Action("upload", f"{manifest.release_name} is already active", noop=True),
            Action("deploy", "device already runs this bundle and is healthy", noop=True),
        ]
    return [
        Action("upload", f"upload {bundle_size / 1e6:.1f} MB to {device.root}/incoming"),
        Action(
            "deploy",
            f"verify, activate {manifest.release_name} (now: {facts.current_release or 'none'}), restart, health-check",
        ),
    ]
