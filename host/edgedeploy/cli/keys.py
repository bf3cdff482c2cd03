"""`edgedeploy keys generate|list|install` and `edgedeploy sign`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from ..inventory import Inventory
from . import render
from .options import POSITIVE, InventoryOpt, JsonOpt, bundle_path, in_range

app = typer.Typer(help="Bundle-signing keys (ed25519) and the keys devices pin.", no_args_is_help=True)


@app.command()
def generate(
    name: Annotated[str, typer.Argument(help="key name, e.g. fleet-2026")],
    force: Annotated[bool, typer.Option(help="overwrite an existing key of this name")] = False,
    json_: JsonOpt = False,
) -> None:
    """Make a new signing key pair in the host's keys folder."""
    from .. import signing

    key = signing.generate_key(name, force=force)
    if json_:
        render.print_json(dataclasses.asdict(key))
        return
    render.out.print(f"{key.name}: key id {key.key_id}\n{key.public}")
    render.info(f"private key in {signing.keys_dir() / (name + '.key')}: keep it off devices and out of backups")


@app.command("list")
def list_(json_: JsonOpt = False) -> None:
    """The keys on this host (every public key here is pinned on devices at enrolment)."""
    from .. import signing

    keys = signing.list_keys()
    if json_:
        render.print_json([dataclasses.asdict(k) for k in keys])
        return
    render.table(
        str(signing.keys_dir()),
        ["name", "key id", "private key", "public key"],
        [[k.name, k.key_id, "yes" if k.has_private else "no", k.public] for k in keys],
    )


@app.command()
def install(
    device: Annotated[str | None, typer.Argument(help="device name (or --group)")] = None,
    group: Annotated[str | None, typer.Option("--group", help="every device with this tag")] = None,
    inventory: InventoryOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Pin exactly this host's public keys on devices (after `keys generate` for a rotation).

    Exit 0 when every device took them, 5 when some did (partial), 1 when none did.
    """
    from .. import api

    inv = Inventory.load(inventory)
    fleet = api.install_fleet_keys(inv, api.select_devices(inv, [device] if device else None, group))
    render.fleet_result(fleet, json_, lambda keys: f"pinned {', '.join(keys)}")
    if fleet.exit_code:
        raise typer.Exit(fleet.exit_code)


def register(root: typer.Typer) -> None:
    @root.command()
    def sign(
        bundle: Annotated[Path, typer.Argument(help="bundle file to sign")],
        key: Annotated[str, typer.Option("--key", "-k", help="signing key name (`edgedeploy keys list`)")],
        out: Annotated[Path | None, typer.Option("--out", "-o", help="signed bundle (default: in place)")] = None,
        expires_days: Annotated[
            float, typer.Option("--expires-days", help="the signature's validity", callback=POSITIVE)
        ] = 90.0,
        serial: Annotated[
            int | None, typer.Option(help="serial (default: higher than any signed here)", callback=in_range(1))
        ] = None,
        json_: JsonOpt = False,
    ) -> None:
        """Give a bundle a new serial and expiry and sign its manifest (a new bundle id)."""
        from .. import api, signing

        api.inspect_bundle(bundle)
        m = signing.sign_bundle(bundle, key, bundle_path(out or bundle), expires_days=expires_days, serial=serial)
        info = {"bundle": str(out or bundle), "release": m.release_name, "serial": m.serial, "expires": m.expires}
        if json_:
            render.print_json(info)
            return
        render.out.print(f"signed {info['bundle']}: {m.release_name}, serial {m.serial}, expires {m.expires}")
