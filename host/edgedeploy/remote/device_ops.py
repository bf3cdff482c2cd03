"""What the CLI does to devices named in the inventory over their transport: connect, act, and log what was
done in the host's per-device log (push, manual rollback, signing keys, facts, waiting for and stopping an
agent). The fleet forms go through run_fleet: one device's failure never hides the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import EdgeDeployError, InputError, error_code
from ..inventory import Device, Inventory
from ..signing import fleet_public_keys
from .agent_client import AgentClient
from .blobs import bundle_blobs
from .connect import connected
from .execute import DEFAULT_PUSH, PushOptions, PushResult, get_facts, install_keys, push
from .execute import rollback as rollback_on
from .execute import stop_agent as stop_agent_on
from .execute import wait_finished as wait_finished_on
from .facts import DeviceFacts
from .fleet import FleetResult, run_fleet
from .rollout_runner import DEFAULT_NET, Network, device_log


def facts(inv: Inventory, name: str) -> DeviceFacts:
    dev = inv.get(name)
    with connected(dev, inv.known_hosts) as t:
        return get_facts(AgentClient(t, dev))


def wait_finished(inv: Inventory, name: str, timeout: float) -> str | None:
    """Until the device's agent has ended its run (finished, failed, stopped): that state, or None."""
    dev = inv.get(name)
    with connected(dev, inv.known_hosts) as t:
        return wait_finished_on(AgentClient(t, dev), timeout)


def stop_agent(inv: Inventory, name: str) -> None:
    """Best effort (at exit): stop the device's agent; an unreachable device is left as it is."""
    dev = inv.get(name)
    try:
        with connected(dev, inv.known_hosts) as t:
            stop_agent_on(AgentClient(t, dev))
    except EdgeDeployError:
        pass


def push_bundle(
    inv: Inventory, name: str, bundle: Path, options: PushOptions = DEFAULT_PUSH, net: Network = DEFAULT_NET
) -> PushResult:
    dev = inv.get(name)
    blobs = bundle_blobs(bundle)
    options.step("connect")
    into = "" if options.model == DEFAULT_SLOT else f" as model {options.model}"
    device_log(name, f"push {blobs.manifest.release_name}{into}{' (dry run)' if options.dry_run else ''}")
    try:
        with connected(dev, inv.known_hosts, net.connect_timeout, net.io_timeout) as t:
            r = push(t, dev, blobs, options)
    except EdgeDeployError as e:
        device_log(name, f"push failed [{error_code(e)}]: {e.message}")
        raise
    device_log(name, f"push {r.outcome} {r.release}, sent {r.uploaded_bytes} bytes, timings {r.timings}")
    return r


def rollback(inv: Inventory, name: str, timeout: float = 60.0, model: str = DEFAULT_SLOT) -> dict[str, Any]:
    dev = inv.get(name)
    with connected(dev, inv.known_hosts) as t:
        result = rollback_on(t, dev, timeout, model)
    of = "" if model == DEFAULT_SLOT else f" of model {model}"
    device_log(name, f"manual rollback{of} to {result.get('release')} (was {result.get('previous')})")
    return result


def rollback_fleet(
    inv: Inventory, names: list[str], timeout: float = 60.0, model: str = DEFAULT_SLOT
) -> FleetResult[dict[str, Any]]:
    """rollback() on each device in parallel; one failure never hides the others."""

    def one(dev: Device) -> dict[str, Any]:
        try:
            return rollback(inv, dev.name, timeout, model)
        except EdgeDeployError as e:
            device_log(dev.name, f"manual rollback failed [{error_code(e)}]: {e.message}")
            raise

    return run_fleet(inv.select(names), one)


def install_fleet_keys(inv: Inventory, names: list[str]) -> FleetResult[list[str]]:
    """Pin the host's public signing keys (current + next) on each device; returns the pinned key names."""
    keys = fleet_public_keys()
    if not keys:
        raise InputError("no signing keys on this host", hint="run `edgedeploy keys generate NAME` first")

    def one(dev: Device) -> list[str]:
        with connected(dev, inv.known_hosts) as t:
            pinned: list[str] = install_keys(t, dev, keys)
        device_log(dev.name, f"pinned signing keys {pinned}")
        return pinned

    return run_fleet(inv.select(names), one)
