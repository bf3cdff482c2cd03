"""`edgedeploy logs`: the agent's log from a device (journald in systemd mode, the log file in process mode)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from edgedeploy_agent.agentlog import DEFAULT_LINES, MAX_LINES
from edgedeploy_agent.names import DEFAULT_SLOT

from ..inventory import Inventory
from .options import POSITIVE, InventoryOpt, ModelOpt, in_range

EXIT_INTERRUPTED = 130


def register(app: typer.Typer) -> None:
    @app.command()
    def logs(
        device: Annotated[str, typer.Argument(help="device name")],
        lines: Annotated[
            int,
            typer.Option("--lines", "-n", help=f"the last N lines (1..{MAX_LINES})", callback=in_range(1, MAX_LINES)),
        ] = DEFAULT_LINES,
        since: Annotated[str | None, typer.Option(help="only lines from this long ago on: 90s, 30m, 1h, 2d")] = None,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines; Ctrl-C ends")] = False,
        io_timeout: Annotated[
            float,
            typer.Option(
                "--io-timeout", help="seconds of silence before the link is probed (and given up)", callback=POSITIVE
            ),
        ] = 30.0,
        model: ModelOpt = DEFAULT_SLOT,
        inventory: InventoryOpt = None,
    ) -> None:
        """Print the agent's log from the device (--model NAME: that model slot's agent): its last lines (--lines,
        --since), then with --follow the new ones as they come. A link that drops is one line and exit 3, noticed
        within about twice --io-timeout; Ctrl-C ends --follow (exit 130) and the device's side with it."""
        from .. import field_api

        out, err = sys.stdout.buffer, sys.stderr.buffer

        def emit(chunk: bytes) -> None:
            out.write(chunk)
            out.flush()

        def warn(chunk: bytes) -> None:
            err.write(chunk)
            err.flush()

        try:
            field_api.device_logs(
                Inventory.load(inventory), device, emit, warn, lines=lines, since=since, follow=follow,
                io_timeout=io_timeout, model=model,
            )  # fmt: skip
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
