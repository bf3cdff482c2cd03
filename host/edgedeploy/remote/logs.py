"""`edgedeploy logs`: the agent's log from the device, streamed (`edgedeploy-agent logs` does the reading)."""

from __future__ import annotations

import json

from edgedeploy_agent.agentlog import MAX_LINES
from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import DeviceError, InputError
from ..inventory import Device
from .execute import model_args
from .transport import Sink, Transport
from .verify import too_old

_KEEP_STDERR = 1 << 16


def logs_argv(device: Device, lines: int, since_s: float | None, follow: bool, model: str = DEFAULT_SLOT) -> list[str]:
    """Pure: the agent command for the log of model slot `model`, as an argv list (every value validated or
    formatted here, never spliced)."""
    if not 0 < lines <= MAX_LINES:
        raise InputError(f"--lines must be between 1 and {MAX_LINES}, got {lines}")
    argv = [device.agent_command, "--root", device.root, "--json", "logs", "--lines", str(int(lines))]
    argv += model_args(model)
    if since_s is not None:
        argv += ["--since", f"{since_s:.0f}s"]
    return argv + (["--follow"] if follow else [])


def device_error(device: Device, code: int, stderr: bytes) -> DeviceError:
    """Pure: the agent's one-line JSON error on stderr (or its last line) -> a DeviceError."""
    lines = [ln for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    try:
        data = json.loads(lines[-1]) if lines else {}
        error = data.get("error") if isinstance(data, dict) else None
    except ValueError:
        error = None
    if isinstance(error, dict):
        return DeviceError(
            f"{device.name}: {error.get('message')}", error.get("hint"), error.get("code", "device-error")
        )
    if code == 127:
        return DeviceError(
            f"{device.name}: edgedeploy-agent not found on the device",
            hint="install the agent on the device or fix agent_command in the inventory",
            code="agent-missing",
        )
    return too_old(
        DeviceError(f"{device.name}: reading the log failed (exit {code}): {(lines or ['no output'])[-1]}"),
        device,
        "logs",
    )


def stream_logs(
    transport: Transport, device: Device, lines: int, since_s: float | None, follow: bool, out: Sink, err: Sink,
    model: str = DEFAULT_SLOT,
) -> None:  # fmt: skip
    """Print the agent's log lines through `out` as they arrive; its warnings through `err` once it ends."""
    kept = bytearray()

    def keep(chunk: bytes) -> None:
        kept.extend(chunk)
        del kept[:-_KEEP_STDERR]

    code = transport.stream(logs_argv(device, lines, since_s, follow, model), out, keep)
    if code != 0:
        raise device_error(device, code, bytes(kept))
    if kept.strip():
        err(bytes(kept))
