"""`edgedeploy report DEVICE --plot out.png`: draw what a device reported."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..inventory import Inventory
from . import render
from .options import InventoryOpt, JsonOpt


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        device: Annotated[str, typer.Argument(help="device name")],
        plot: Annotated[Path, typer.Option("--plot", help="PNG to write: latency histograms and a power timeline")],
        offline: Annotated[
            bool, typer.Option("--offline", help="use the reports already pulled; no connection")
        ] = False,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Pull new reports (unless --offline) and draw them."""
        from .. import api

        inv = Inventory.load(inventory)
        reports = api.stored_reports(inv, device) if offline else api.status(inv, device).reports
        drawn = api.plot_device_reports(device, reports, plot)
        if json_:
            render.print_json(drawn)
        else:
            render.out.print(f"{device}: wrote {plot} ({len(reports)} reports, {drawn['frames']['infer']} frames)")
