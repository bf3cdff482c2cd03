"""Executing plans on a device: push a bundle, roll back, enrol."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import DeviceError, EdgeDeployError
from ..inventory import Device
from .agent_client import AgentClient
from .blobs import BundleBlobs
from .facts import DeviceFacts, parse_facts
from .plan import DEFAULT_HEALTH, Action, HealthPolicy, plan_push
from .transport import Progress, Transport


def _no_step(_: str) -> None:
    pass


@dataclass(frozen=True)
class PushOptions:
    """How a push runs, the same from the CLI, a rollout or the demo: plan only (`dry_run`), deploy even a
    release the device already runs (`force`), the health rule, and progress callbacks (bytes, steps)."""

    dry_run: bool = False
    force: bool = False
    health: HealthPolicy = DEFAULT_HEALTH
    progress: Progress | None = None
    step: Callable[[str], None] = _no_step
    model: str = DEFAULT_SLOT  # the model slot on the device (`push --model`)


DEFAULT_PUSH = PushOptions()


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
    model: str = DEFAULT_SLOT


def model_args(model: str) -> list[str]:
    """`--model SLOT` for an agent command about one model slot (none for `default`: every agent reads that)."""
    return [] if model == DEFAULT_SLOT else ["--model", model]


def get_facts(client: AgentClient, model: str = DEFAULT_SLOT) -> DeviceFacts:
    """The device's facts, with `model`'s slot at the top (every slot is under `models`)."""
    return parse_facts(client.call("facts", *model_args(model), timeout=60), client.device.name)


def push(transport: Transport, device: Device, blobs: BundleBlobs, options: PushOptions = DEFAULT_PUSH) -> PushResult:
    """facts -> plan -> upload the missing blobs -> deploy (verify, activate, health-check) on the device."""
    timings: dict[str, float] = {}
    manifest = blobs.manifest
    client = AgentClient(transport, device)
    options.step("facts")
    # one round trip: the device's facts and which blobs it lacks (read only: nothing changes there)
    raw = client.call("facts", *model_args(options.model), "--blobs", *[b.sha256 for b in blobs.blobs], timeout=300)
    facts = parse_facts(raw, device.name)  # validates `blobs` too (absent: the root is not initialised)
    lacking = set(raw["blobs"]["missing"]) if raw["blobs"] else {b.sha256 for b in blobs.blobs}
    actions = plan_push(blobs, lacking, device, facts, options.force, options.health, options.model)
    if options.dry_run or all(a.noop for a in actions):
        outcome = "planned" if options.dry_run else "unchanged"
        current = facts.current_release
        return PushResult(device.name, outcome, manifest.release_name, current, actions, timings, model=options.model)
    result: dict[str, Any] = {}
    uploaded = 0
    for action in actions:
        if action.noop:
            continue
        options.step(action.detail if action.kind == "upload" else action.kind)
        t = time.monotonic()
        if action.puts:
            uploaded = _upload(transport, action, options.progress)
            timings["upload_s"] = round(time.monotonic() - t, 3)
        if action.argv:
            result = _run_deploy(client, action)
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
        uploaded_bytes=uploaded,
        model=options.model,
    )


def _upload(transport: Transport, action: Action, progress: Progress | None) -> int:
    """Send an action's files, reporting progress over all of them; returns the bytes sent."""
    total = action.upload_bytes
    sent = 0
    for local, remote in action.puts:

        def each(done: int, size: int, base: int = sent) -> None:
            if progress:
                progress(base + done, total)

        transport.put(local, remote, progress=each)
        sent += local.stat().st_size
    return sent


def _run_deploy(client: AgentClient, action: Action) -> dict[str, Any]:
    try:
        return client.run(action.argv, action.timeout_s)
    except DeviceError as e:
        if e.code == "health-check-failed":
            e.message = f"{e.message} (rolled back automatically)"
        if e.code == "agent-killed":
            e.message = f"{e.message}; {_read_back(client)}"
        raise


def _read_back(client: AgentClient) -> str:
    """The device's state after an interrupted deploy, once it has recovered (`recover`: the one call
    that finishes an interrupted transition; facts never do)."""
    try:
        client.call("recover", timeout=120)
        f = get_facts(client)
    except EdgeDeployError as e:
        return f"its state could not be read back ({e.message})"
    return f"read back: the device is on {f.current_release or 'no bundle'} (agent {f.health_state or 'not started'})"


def rollback(transport: Transport, device: Device, timeout: float = 60.0, model: str = DEFAULT_SLOT) -> dict[str, Any]:
    args = ["rollback", "--timeout", str(timeout), *model_args(model)]
    return {**AgentClient(transport, device).call(*args, timeout=timeout * 2 + 60), "model": model}


def init_agent(transport: Transport, device: Device) -> dict[str, Any]:
    args = ["init", "--device-name", device.name, "--service", device.service, "--profile", device.profile]
    args += ["--keep-releases", str(device.keep_releases)]
    args += device.source_args()
    return AgentClient(transport, device).call(*args, timeout=60)


def install_keys(transport: Transport, device: Device, public_keys: list[str]) -> list[str]:
    """Pin exactly these signing keys on the device; from then on it runs signed bundles only."""
    return list(AgentClient(transport, device).call("trust", "--set", *public_keys, timeout=60)["trusted_keys"])


def wait_finished(client: AgentClient, timeout: float) -> str | None:
    """Poll the agent's health until its run ended (a play-once source: finished, failed or stopped);
    returns that state, or None when `timeout` passed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = get_facts(client).health_state
        if state in ("finished", "failed", "stopped"):
            return state
        time.sleep(0.3)
    return None


def stop_agent(client: AgentClient) -> None:
    client.call("stop")
