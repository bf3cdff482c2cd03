"""The pure push planner: (bundle blobs, device, facts) -> actions that carry what they run. No I/O here."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import DeviceError, InputError
from ..inventory import Device
from .agent_client import agent_argv
from .blobs import BundleBlobs
from .facts import DeviceFacts

SPACE_MARGIN = 32 << 20


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

    @property
    def deploy_timeout(self) -> float:
        """How long the host waits for the agent's deploy: its health checks (old and new), plus slack."""
        return max(self.timeout, self.build_timeout or 0) * 2 + 120


DEFAULT_HEALTH = HealthPolicy()


@dataclass(frozen=True)
class Action:
    """One step of a push. The executor runs exactly what it holds: `puts` (local file, remote path),
    then `argv` (the agent command line) with `timeout_s`; `--dry-run` prints the same."""

    kind: str  # "upload" | "deploy"
    detail: str
    noop: bool = False
    puts: tuple[tuple[Path, str], ...] = field(default=())
    argv: tuple[str, ...] = ()
    timeout_s: float = 0.0

    @property
    def upload_bytes(self) -> int:
        return sum(local.stat().st_size for local, _ in self.puts)


def plan_push(
    blobs: BundleBlobs,
    lacking: Collection[str],
    device: Device,
    facts: DeviceFacts,
    force: bool = False,
    health: HealthPolicy = DEFAULT_HEALTH,
    model: str = DEFAULT_SLOT,
) -> list[Action]:
    """Check the bundle fits the device, then list what must happen. Raises on anything that cannot work.
    `facts` describe the model slot `model` (`facts --model`), which the deploy goes into.

    `lacking` are the sha256 of the blobs the device does not have; only they need room (blobs are stored
    once and hard-linked into releases).
    """
    manifest = blobs.manifest
    missing = [b for b in blobs.blobs if b.sha256 in lacking]
    upload_bytes = sum(b.size for b in missing)
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
    running = (  # an interrupted transition is never a no-op: the deploy recovers it first
        facts.pending_state is None
        and facts.current_release == manifest.release_name
        and facts.running
        and facts.healthy_release == manifest.release_name
    )
    if running and not force:
        return [
            Action("upload", f"{manifest.release_name} is already active", noop=True),
            Action("deploy", "device already runs this bundle and is healthy", noop=True),
        ]
    total = len(blobs.blobs)
    upload = (
        Action("upload", f"all {total} blobs already on the device", noop=True)
        if not missing
        else Action(
            "upload",
            f"upload {len(missing)} of {total} blobs, {upload_bytes / 1e6:.1f} MB",
            puts=tuple((b.local, f"{device.root}/blobs/incoming/{b.sha256}") for b in missing),
        )
    )
    args = ["deploy", "--manifest-blob", blobs.manifest_sha, *health.agent_args()]
    if blobs.signature_sha:
        args += ["--signature-blob", blobs.signature_sha]
    args += device.source_args(model)
    if model != DEFAULT_SLOT:
        args += ["--model", model]
    if force:
        args.append("--force")
    deploy = Action(
        "deploy",
        f"verify, activate {manifest.release_name}{'' if model == DEFAULT_SLOT else ' as model ' + model} "
        f"(now: {facts.current_release or 'none'}), restart, health-check",
        argv=tuple(agent_argv(device, *args)),
        timeout_s=health.deploy_timeout,
    )
    return [upload, deploy]
