"""Options shared by several commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        envvar="EDGEDEPLOY_INVENTORY",
        help="devices TOML (default: devices.toml in the user config folder)",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]
