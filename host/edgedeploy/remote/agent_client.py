"""Calls `edgedeploy-agent --json ...` on a device and turns its answers into values or errors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import DeviceError
from ..inventory import Device
from .transport import CommandResult, Transport


def parse_agent_output(result: CommandResult, device: str) -> dict[str, Any]:
    """Pure parser: the agent prints one JSON object as its last stdout line."""
    lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
    data: dict[str, Any] | None = None
    if lines:
        try:
            parsed = json.loads(lines[-1])
            data = parsed if isinstance(parsed, dict) else None
        except ValueError:
            data = None
    if data is None:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        if result.exit_code < 0:
            command = " ".join(result.argv[4:5]) or "a command"  # argv: agent --root ROOT --json COMMAND ...
            raise DeviceError(
                f"{device}: the agent was killed on the device while running `{command}` (the SSH link is up)",
                hint="the device undoes an interrupted deploy by itself; the kernel log (OOM killer?) and "
                "ROOT/logs/agent.log on the device say why it died",
                code="agent-killed",
            )
        if result.exit_code == 127:
            raise DeviceError(
                f"{device}: edgedeploy-agent not found on the device ({detail})",
                hint="install the agent on the device or fix agent_command in the inventory",
                code="agent-missing",
            )
        raise DeviceError(f"{device}: agent gave no result (exit {result.exit_code}): {detail}")
    if not data.get("ok"):
        err = data.get("error") or {}
        raise DeviceError(
            f"{device}: {err.get('message', 'agent failed')}",
            hint=err.get("hint"),
            code=err.get("code", "device-error"),
        )
    return data


def agent_argv(device: Device, *args: str) -> list[str]:
    """The command line of one agent call on `device` (`edgedeploy-agent --root ROOT --json ARGS`)."""
    return [device.agent_command, "--root", device.root, "--json", *args]


class AgentClient:
    def __init__(self, transport: Transport, device: Device) -> None:
        self.transport, self.device = transport, device

    def call(self, *args: str, timeout: float | None = 120.0) -> dict[str, Any]:
        return self.run(agent_argv(self.device, *args), timeout)

    def run(self, argv: Sequence[str], timeout: float | None) -> dict[str, Any]:
        """Run a command line made by `agent_argv` (a plan's action holds one)."""
        return parse_agent_output(self.transport.run(list(argv), timeout=timeout), self.device.name)
