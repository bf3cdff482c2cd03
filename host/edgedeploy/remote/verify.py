"""`edgedeploy verify`: the device's self-test through its agent, plus what only the host can judge (its
clock against the host's, the agent's version against the host's)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from edgedeploy_agent.names import DEFAULT_SLOT
from edgedeploy_agent.selftest import FAILED, OK, WARNING, Check, check_clock, worst

from .. import __version__
from ..errors import DeviceError
from ..inventory import Device
from .agent_client import AgentClient
from .execute import model_args
from .transport import Transport

_RANK = {OK: 0, WARNING: 1, FAILED: 2}


@dataclass(frozen=True)
class Checkup:
    """One device's checklist."""

    device: str
    checks: list[Check]

    @property
    def overall(self) -> str:
        return worst([c.status for c in self.checks])

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "overall": self.overall, "checks": [c.as_dict() for c in self.checks]}


def too_old(e: DeviceError, device: Device, command: str) -> DeviceError:
    """An agent that predates `command` answers with argparse's 'invalid choice': say what to do."""
    if "invalid choice" not in e.message:
        return e
    return DeviceError(
        f"{device.name}: the agent on the device has no `{command}` command (it is older than this host)",
        hint=f"update it: edgedeploy agent install {device.name}",
        code="agent-too-old",
    )


def with_host_view(name: str, answer: dict[str, Any], sent: float, received: float, host_version: str) -> Checkup:
    """Pure: the agent's checks, with the clock compared to the host's and the versions to each other."""
    checks = []
    for c in (Check.from_dict(d) for d in answer["checks"]):
        if c.name == "clock" and "time" in c.data:
            host = check_clock(float(c.data["time"]), None, (sent, received))
            c = c if _RANK[c.status] > _RANK[host.status] else host  # keep the agent's "before the bundle" finding
        elif c.name == "agent" and c.status == OK and c.data.get("agent_version") != host_version:
            c = replace(
                c,
                status=WARNING,
                detail=f"{c.detail}; this host runs edgedeploy {host_version}",
                fix=f"update the agent: edgedeploy agent install {name}",
            )
        checks.append(c)
    return Checkup(name, checks)


def verify_device(
    transport: Transport,
    device: Device,
    camera_seconds: float = 5.0,
    host_version: str = __version__,
    model: str = DEFAULT_SLOT,
) -> Checkup:
    """The device's self-test about model slot `model` (its release, health, source and service)."""
    client = AgentClient(transport, device)
    sent = time.time()
    args = ("selftest", "--camera-seconds", f"{camera_seconds:g}", *model_args(model))
    try:
        answer = client.call(*args, timeout=120 + camera_seconds)
    except DeviceError as e:
        raise too_old(e, device, "selftest") from None
    return with_host_view(device.name, answer, sent, time.time(), host_version)
