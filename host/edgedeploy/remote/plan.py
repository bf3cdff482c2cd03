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
    manifest: Manifest,
    upload_bytes: int,
    device: Device,
    facts: DeviceFacts,
    force: bool = False,
    missing_blobs: tuple[int, int] | None = None,
) -> list[Action]:
    """Check the bundle fits the device, then list what must happen. Raises on anything that cannot work.

    `upload_bytes` is what the device lacks (blobs are stored once and hard-linked into releases, so
    nothing else needs room); `missing_blobs` is (missing, total) for the description.
    """
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
    needed = upload_bytes + SPACE_MARGIN
    if facts.free_bytes is not None and facts.free_bytes < needed:
        raise DeviceError(
            f"{device.name}: not enough disk: {facts.free_bytes >> 20} MiB free, "
            f"{needed >> 20} MiB needed (missing blobs + margin)",
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
    missing, total = missing_blobs or (1, 1)
    upload = (
        Action("upload", f"all {total} blobs already on the device", noop=True)
        if missing == 0
        else Action("upload", f"upload {missing} of {total} blobs, {upload_bytes / 1e6:.1f} MB")
    )
    return [
        upload,
        Action(
            "deploy",
            f"verify, activate {manifest.release_name} (now: {facts.current_release or 'none'}), restart, health-check",
        ),
    ]
