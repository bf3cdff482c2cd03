"""`edgedeploy status` over SSH: a device's facts and the reports it spooled since the last pull, with every
report pulled before; for one device or the fleet (in parallel, one failure per device)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import InputError
from ..inventory import Device, Inventory
from .agent_client import AgentClient
from .connect import connected
from .execute import get_facts
from .facts import DeviceFacts
from .fleet import FleetResult, run_fleet
from .reports import load_local_reports, pull_reports, reports_dir


@dataclass
class DeviceStatus:
    device: Device
    facts: DeviceFacts
    new_reports: list[dict[str, Any]]
    reports: list[dict[str, Any]]


def status(inv: Inventory, name: str, dest: Path | None = None, model: str = DEFAULT_SLOT) -> DeviceStatus:
    """Pull new reports over the device's transport and return them with everything pulled before; the facts
    describe the model slot `model` (every slot is under `facts.models`)."""
    return _device_status(inv, inv.get(name), dest, model)


def fleet_status(inv: Inventory, tag: str | None = None) -> FleetResult[DeviceStatus]:
    """status() for every device (or those tagged `tag`), in parallel; failures are per device."""
    devices = inv.select(tag=tag)
    if not devices:
        where = f"tagged {tag!r}" if tag else "in the inventory"
        raise InputError(f"no devices {where} ({inv.path})", hint="add one with `edgedeploy devices add`")
    return run_fleet(devices, lambda d: _device_status(inv, d, None))


def stored_reports(inv: Inventory, name: str) -> list[dict[str, Any]]:
    """The reports already pulled from a device, oldest first (no connection)."""
    return load_local_reports(reports_dir(inv.get(name).name))


def _device_status(inv: Inventory, dev: Device, dest: Path | None, model: str = DEFAULT_SLOT) -> DeviceStatus:
    d = dest or reports_dir(dev.name)
    with connected(dev, inv.known_hosts) as t:
        f = get_facts(AgentClient(t, dev), model)
        new = pull_reports(t, dev, d)
    return DeviceStatus(dev, f, new, load_local_reports(d))
