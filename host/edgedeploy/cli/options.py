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
SourceOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--source",
        help="a file the bundle was built from (source or Q/DQ model) when the build store lacks it; "
        "checked by sha256, then stored again (repeatable)",
    ),
]

# health objectives checked on the device after activation (any miss rolls the device back)
TimeoutOpt = Annotated[float, typer.Option(help="seconds to wait for the agent to report healthy")]
MinInferencesOpt = Annotated[
    int, typer.Option("--min-inferences", help="successful inferences required after ready (0: ready is enough)")
]
MaxP95Opt = Annotated[float | None, typer.Option("--max-p95-ms", help="health objective: inference p95 latency")]
MinFpsOpt = Annotated[float | None, typer.Option("--min-fps", help="health objective: frames per second")]
ConnectTimeoutOpt = Annotated[float, typer.Option("--connect-timeout", help="seconds to wait for SSH to connect")]
IoTimeoutOpt = Annotated[
    float, typer.Option("--io-timeout", help="seconds an upload may stall before it is given up (it resumes later)")
]
