"""`edgedeploy fleet-servers init DIR`: the registry and broker of a pilot fleet, ready to start (docs/fleet.md)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Annotated

import typer

from ..fleet_init import PUBLISHER, FleetSetup, Ports, init_fleet_servers
from ..signing import list_keys
from . import render
from .options import JsonOpt, in_range

app = typer.Typer(help="The registry and MQTT broker of a pilot fleet (docs/fleet.md).", no_args_is_help=True)

PortOpt = in_range(1, 65535)


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(help="new or empty folder for configuration, passwords and data")],
    listen: Annotated[str, typer.Option(help="address of what devices reach: MQTT, the registry cache")] = "0.0.0.0",
    public_host: Annotated[
        str | None, typer.Option(help="the name devices reach this host by (default: its FQDN, or --listen)")
    ] = None,
    user: Annotated[str | None, typer.Option(help="account the servers run as (default: you)")] = None,
    mqtt_port: Annotated[int, typer.Option(help="devices' MQTT listener", callback=PortOpt)] = Ports.mqtt,
    controller_port: Annotated[
        int, typer.Option(help="controller's MQTT listener (loopback)", callback=PortOpt)
    ] = Ports.controller,
    origin_port: Annotated[int, typer.Option(help="registry origin (loopback)", callback=PortOpt)] = Ports.origin,
    readonly_port: Annotated[
        int, typer.Option(help="registry read-only endpoint (loopback)", callback=PortOpt)
    ] = Ports.readonly,
    cache_port: Annotated[int, typer.Option(help="registry cache devices pull from", callback=PortOpt)] = Ports.cache,
    rollout_key: Annotated[str, typer.Option(help="key that signs desired state, for fleet.toml")] = "rollout-1",
    json_: JsonOpt = False,
) -> None:
    """Write mosquitto's and the registry's configuration, passwords (0600, never printed) and systemd units for
    a pilot fleet on this host, and print how to start them. Never overwrites an existing set-up."""
    ports = Ports(mqtt_port, controller_port, origin_port, readonly_port, cache_port)
    setup = init_fleet_servers(
        directory, listen=listen, public_host=public_host, ports=ports, user=user, rollout_key=rollout_key
    )
    if json_:
        render.print_json(dataclasses.asdict(setup))
        return
    for line in next_steps(setup, have_key=any(k.name == rollout_key and k.has_private for k in list_keys())):
        render.out.print(line, markup=False)


def next_steps(setup: FleetSetup, have_key: bool) -> list[str]:
    """Pure: what init wrote and the commands that follow, each ready to copy."""
    d = setup.directory
    units = " ".join(s.unit.removesuffix(".service") for s in setup.servers)
    fleet_toml = (
        f"controller configuration: {setup.fleet_toml_installed} (a copy in {setup.fleet_toml})"
        if setup.fleet_toml_installed
        else f"controller configuration: {setup.fleet_toml} (your fleet.toml exists and was left as it is)"
    )
    lines = [f"wrote {d}; the servers run as {setup.user}:"]
    lines += [f"  {s.name:18s} {', '.join(s.listen):32s} {s.role}" for s in setup.servers]
    lines += [
        f"passwords (0600, printed nowhere): registry user {PUBLISHER} in {setup.publisher_password_file}, "
        f"broker user controller in {setup.controller_password_file}",
        fleet_toml,
        "",
        "start them with systemd (Debian's own mosquitto and docker-registry services hold ports 1883 and 5000):",
        "  sudo systemctl disable --now mosquitto docker-registry",
        f"  sudo cp {d}/systemd/*.service /etc/systemd/system/",
        "  sudo systemctl daemon-reload",
        f"  sudo systemctl enable --now {units}",
        "or in the foreground, one terminal each:",
        *(f"  {shlex.join(s.argv)}" for s in setup.servers),
        "",
        "then:",
        *([] if have_key else [f"  edgedeploy keys generate {setup.rollout_key}"]),
        f"  edgedeploy agent install DEVICE --mqtt {setup.device_broker} --registry {setup.device_registry} "
        f"--broker-passwd {setup.broker_passwd}",
        "  sudo systemctl reload edgedeploy-mosquitto   # the broker reads the device's new user",
        f'  EDGEDEPLOY_REGISTRY_PASSWORD="$(cat {setup.publisher_password_file})" '
        f"edgedeploy publish SIGNED.edb --registry {setup.publish_registry}/models/NAME --user {PUBLISHER}",
        "  edgedeploy rollout SIGNED.edb --devices DEVICE --via mqtt",
    ]
    return lines
