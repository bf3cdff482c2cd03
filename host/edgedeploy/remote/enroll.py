"""Enrolment: pin a device's SSH host key (the one place a key is accepted without being pinned yet), then
initialise its agent root and pin the fleet's bundle-signing keys there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConnectionFailed, InputError
from ..inventory import Device, Inventory
from ..signing import fleet_public_keys
from .agent_client import AgentClient
from .connect import connected
from .execute import get_facts, init_agent, install_keys
from .transport import Transport


def enroll(
    inv: Inventory,
    name: str,
    expect_fingerprint: str | None = None,
    replace: bool = False,
    confirm: Callable[[str], bool] = lambda fp: True,
) -> dict[str, Any]:
    """`devices enroll`: pin the host key `confirm` accepts, then initialise the agent root over the pinned
    connection and pin the fleet's signing keys there."""
    dev = inv.get(name)
    fp = pin_device_key(inv.known_hosts, dev, expect_fingerprint, replace, confirm)
    with connected(dev, inv.known_hosts) as t:
        return {"device": name, "fingerprint": fp, **enroll_device(t, dev, fleet_public_keys())}


def pin_device_key(
    known_hosts: Path,
    dev: Device,
    expect_fingerprint: str | None,
    replace: bool,
    confirm: Callable[[str], bool],
) -> str | None:
    """The fingerprint of the key the device offers, pinned in `known_hosts` once `confirm(fp)` agrees;
    a changed key only with `replace`. None for a local device (no SSH)."""
    if dev.transport != "ssh":
        return None
    from .ssh import fetch_host_key, fingerprint, pin_host_key, pinned_fingerprint

    key = fetch_host_key(dev.host, dev.port)
    fp = fingerprint(key)
    pinned = pinned_fingerprint(known_hosts, dev.host, dev.port)
    if expect_fingerprint and expect_fingerprint != fp:
        raise ConnectionFailed(f"{dev.name}: device offers {fp}, you expected {expect_fingerprint}; not pinned")
    if pinned and pinned != fp and not replace:
        raise ConnectionFailed(
            f"{dev.name}: device now offers {fp} but {pinned} is pinned",
            hint="if the device was reinstalled, check the fingerprint and run with --replace",
        )
    if pinned != fp:
        if not confirm(fp):
            raise InputError(f"{dev.name}: host key not accepted; nothing pinned")
        pin_host_key(known_hosts, dev.host, dev.port, key)
    return fp


def enroll_device(transport: Transport, dev: Device, signing_keys: list[str]) -> dict[str, Any]:
    """Initialise the agent root, pin the signing keys (if the fleet has any), and say what the device is."""
    info = init_agent(transport, dev)
    trusted = install_keys(transport, dev, signing_keys) if signing_keys else []
    facts = get_facts(AgentClient(transport, dev))
    return {
        "root": info["root"],
        "arch": facts.arch,
        "python": facts.python,
        "agent_version": facts.agent_version,
        "trusted_keys": trusted,
    }
