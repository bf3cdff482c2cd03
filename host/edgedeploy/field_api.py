"""The façade for work in the field (the CLI calls it like api.py): verify a device, read its log, prepare
a wheelhouse for a device without a network."""

from __future__ import annotations

from pathlib import Path

from edgedeploy_agent.agentlog import parse_since
from edgedeploy_agent.names import DEFAULT_SLOT

from .errors import InputError
from .inventory import Inventory
from .remote.connect import connected
from .remote.fleet import FleetResult, run_fleet
from .remote.logs import stream_logs
from .remote.transport import Sink
from .remote.verify import Checkup, verify_device
from .remote.wheelhouse import Wheelhouse, build_wheelhouse


def verify(inv: Inventory, name: str, camera_seconds: float = 5.0, model: str = DEFAULT_SLOT) -> Checkup:
    """Run the device's self-test about model slot `model` (nothing on the device is stopped or changed)."""
    dev = inv.get(name)
    with connected(dev, inv.known_hosts) as t:
        return verify_device(t, dev, camera_seconds, model=model)


def verify_fleet(
    inv: Inventory, tag: str, camera_seconds: float = 5.0, model: str = DEFAULT_SLOT
) -> FleetResult[Checkup]:
    """verify() on every device tagged `tag`, in parallel; an unreachable device is a failure of its own."""
    devices = inv.select(tag=tag)
    if not devices:
        raise InputError(f"no device in {inv.path} has tag {tag!r}", hint="see `edgedeploy devices list`")
    return run_fleet(devices, lambda d: verify(inv, d.name, camera_seconds, model))


def device_logs(
    inv: Inventory,
    name: str,
    out: Sink,
    err: Sink,
    lines: int = 200,
    since: str | None = None,
    follow: bool = False,
    io_timeout: float = 30.0,
    model: str = DEFAULT_SLOT,
) -> None:
    """Stream the log of model slot `model`'s agent; a dropped link is ConnectionFailed within about 2 x
    io_timeout."""
    try:
        since_s = parse_since(since) if since else None
    except ValueError as e:
        raise InputError(str(e), hint="see edgedeploy logs --help") from None
    dev = inv.get(name)
    with connected(dev, inv.known_hosts, io_timeout=io_timeout) as t:
        stream_logs(t, dev, lines, since_s, follow, out, err, model)


def wheelhouse(out: Path, python: str, platform: str, extras: tuple[str, ...] = ()) -> Wheelhouse:
    """The agent's wheels for a device's Python and platform, downloaded into `out` (this host needs PyPI)."""
    return build_wheelhouse(out, python, platform, extras)
