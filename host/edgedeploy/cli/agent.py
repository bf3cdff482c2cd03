"""`edgedeploy agent install`: bootstrap the agent on a device over SSH."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import api
from ..inventory import Inventory
from . import render
from .options import InventoryOpt, JsonOpt

app = typer.Typer(help="The on-device agent: install it as a service.", no_args_is_help=True)


@app.command()
def install(
    device: Annotated[str, typer.Argument(help="device name")],
    python: Annotated[str, typer.Option(help="Python on the device (python3.9 on JetPack 5)")] = "python3",
    venv: Annotated[str, typer.Option(help="virtual environment on the device")] = "/opt/edgedeploy/venv",
    wheelhouse: Annotated[Path | None, typer.Option(help="folder with the agent wheel (+ dependencies)")] = None,
    runtime_lib: Annotated[Path | None, typer.Option(help="libtvm_runtime.so built for the device")] = None,
    offline: Annotated[bool, typer.Option(help="install dependencies only from --wheelhouse")] = False,
    system_site_packages: Annotated[
        bool, typer.Option(help="let the venv see the system's packages (a GStreamer OpenCV)")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the steps; change nothing")] = False,
    inventory: InventoryOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Create the user and folders, install the agent and its TVM runtime in a venv, install the systemd
    unit, start it and check health. Running it again changes nothing."""
    with render.steps(f"install {device}") as step:
        res = api.install_agent(
            Inventory.load(inventory),
            device,
            python=python,
            venv=venv,
            wheelhouse=wheelhouse,
            runtime_lib=runtime_lib,
            offline=offline,
            system_site_packages=system_site_packages,
            dry_run=dry_run,
            step=step,
        )
    if json_:
        render.print_json(res)
        return
    steps = res["steps"] if dry_run else res["changed"]
    verb = "would do" if dry_run else "changed"
    render.out.print(f"{device}: {verb}: {', '.join(steps) if steps else 'nothing (already installed)'}")
    if not dry_run:
        render.out.print(f"  agent {res['agent_command']}; OpenCV {res['opencv']}; healthy: {res['healthy']}")
