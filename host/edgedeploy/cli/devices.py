"""`edgedeploy devices add|list|remove|enroll|facts`."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError

from ..errors import InputError, validation_text
from ..inventory import Device, Inventory
from ..profiles import get_profile
from . import render
from .options import InventoryOpt, JsonOpt

# process mode has no supervisor of its own (docs/agent-service.md says why): say so where it is chosen
PROCESS_MODE_NOTE = (
    "note: --service process is for labs, containers and tests: nothing restarts an agent that dies after "
    "a commit (`devices facts` and `status` show it as `dead`; the next push starts it again). "
    "On devices use --service systemd, which restarts it (and a container runtime's restart policy does too)."
)

app = typer.Typer(help="The device inventory and host-key enrolment.", no_args_is_help=True)


@app.command()
def add(
    name: str,
    host: Annotated[str, typer.Option(help="address or DNS name")],
    profile: Annotated[str, typer.Option(help="device profile")],
    port: int = 22,
    user: str = "edgedeploy",
    key_file: Annotated[str | None, typer.Option(help="SSH private key")] = None,
    tags: Annotated[str, typer.Option(help="comma-separated tags")] = "",
    root: Annotated[str, typer.Option(help="agent state folder on the device")] = "/var/lib/edgedeploy",
    service: Annotated[str, typer.Option(help="systemd | process")] = "systemd",
    transport: Annotated[str, typer.Option(help="ssh | local (this machine)")] = "ssh",
    agent_command: Annotated[str, typer.Option(help="edgedeploy-agent path on the device")] = "edgedeploy-agent",
    source: Annotated[
        list[str] | None, typer.Option(help="frame source URI on the device; repeat it for several sources")
    ] = None,
    max_batch_wait_ms: Annotated[
        float | None, typer.Option(help="several sources: how long a batch waits for the other sources' frames")
    ] = None,
    keep_releases: Annotated[int, typer.Option(help="releases the device keeps for rollback")] = 3,
    replace: Annotated[bool, typer.Option(help="overwrite an existing entry")] = False,
    inventory: InventoryOpt = None,
) -> None:
    """Add a device to the inventory (then run `devices enroll`)."""
    get_profile(profile)
    try:
        dev = Device.model_validate(
            {
                "name": name,
                "host": host,
                "port": port,
                "user": user,
                "key_file": key_file,
                "profile": profile,
                "tags": [t for t in tags.split(",") if t],
                "root": root,
                "service": service,
                "transport": transport,
                "agent_command": agent_command,
                "source": source[0] if source and len(source) == 1 else None,
                "sources": source if source and len(source) > 1 else [],
                "max_batch_wait_ms": max_batch_wait_ms,
                "keep_releases": keep_releases,
            }
        )
    except ValidationError as e:
        raise InputError(validation_text(e)) from None
    inv = Inventory.load(inventory)
    inv.add(dev, replace=replace)
    render.info(f"added {name} ({dev.address}, {profile}) to {inv.path}; next: edgedeploy devices enroll {name}")
    if dev.service == "process":
        render.info(PROCESS_MODE_NOTE)


@app.command("list")
def list_(inventory: InventoryOpt = None, json_: JsonOpt = False) -> None:
    """List the devices in the inventory."""
    inv = Inventory.load(inventory)
    if json_:
        render.print_json([d.model_dump() for d in inv.devices.values()])
        return
    render.table(
        str(inv.path),
        ["name", "address", "profile", "service", "tags"],
        [
            [d.name, d.address if d.transport == "ssh" else "local", d.profile, d.service, ",".join(d.tags)]
            for d in inv.devices.values()
        ],
    )


@app.command()
def remove(name: str, inventory: InventoryOpt = None) -> None:
    """Remove a device from the inventory."""
    inv = Inventory.load(inventory)
    inv.remove(name)
    render.info(f"removed {name} from {inv.path}")


@app.command()
def enroll(
    name: str,
    fingerprint: Annotated[str | None, typer.Option(help="expected SHA256:... fingerprint")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="accept the shown key without asking")] = False,
    replace: Annotated[bool, typer.Option(help="replace a pinned key that changed")] = False,
    inventory: InventoryOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Show the device's host key fingerprint, pin it, and initialise the agent folder."""
    from .. import api

    inv = Inventory.load(inventory)

    def confirm(fp: str) -> bool:
        render.info(f"{name} host key: {fp}")
        if yes or fingerprint:
            return True
        return typer.confirm("pin this key?", default=False)

    info = api.enroll(inv, name, expect_fingerprint=fingerprint, replace=replace, confirm=confirm)
    if json_:
        render.print_json(info)
        return
    render.info(
        f"enrolled {name}: key {info['fingerprint'] or '(local)'} pinned in {inv.known_hosts}; "
        f"agent {info['agent_version']} on {info['arch']}, Python {info['python']}, root {info['root']}"
    )


@app.command()
def facts(name: str, inventory: InventoryOpt = None, json_: JsonOpt = False) -> None:
    """What the device's agent reports about itself (and recovers an interrupted deploy)."""
    from .. import api

    f = api.facts(Inventory.load(inventory), name)
    if json_:
        render.print_json(f.__dict__)
        return
    render.table(name, ["fact", "value"], [[k, "-" if v in (None, ()) else v] for k, v in f.__dict__.items()])
