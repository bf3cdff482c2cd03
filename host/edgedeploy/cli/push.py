"""`edgedeploy push` and `edgedeploy rollback`."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated

import typer

from .. import api
from ..inventory import Inventory
from . import render
from .options import InventoryOpt, JsonOpt


def register(app: typer.Typer) -> None:
    @app.command()
    def push(
        device: Annotated[str, typer.Argument(help="device name from the inventory")],
        bundle: Annotated[Path, typer.Argument(help="bundle file")],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan, change nothing")] = False,
        force: Annotated[bool, typer.Option(help="redeploy even if the device already runs this bundle")] = False,
        timeout: Annotated[float, typer.Option(help="seconds to wait for the agent to report healthy")] = 60.0,
        prebuild: Annotated[
            bool, typer.Option("--prebuild", help="TensorRT: the health check waits for the engine build")
        ] = False,
        build_timeout: Annotated[float, typer.Option(help="--prebuild: seconds allowed for the engine build")] = 1800.0,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Upload a bundle, activate it atomically, health-check it; the device rolls back on failure."""
        inv = Inventory.load(inventory)
        t = time.perf_counter()
        with render.transfer(f"upload {bundle.name}") as progress, render.steps(f"push {device}") as step:
            result = api.push_bundle(
                inv,
                device,
                bundle,
                dry_run=dry_run,
                force=force,
                timeout=timeout,
                progress=progress,
                step=step,
                build_timeout=build_timeout if prebuild else None,
            )
        secs = time.perf_counter() - t
        if json_:
            render.print_json({**dataclasses.asdict(result), "seconds": round(secs, 3)})
            return
        if dry_run:
            for a in result.actions:
                render.out.print(f"{'no-op' if a.noop else 'will'}  {a.kind:7s} {a.detail}")
            return
        if result.outcome == "unchanged":
            render.out.print(f"{device}: already running {result.release}, nothing to do ({secs:.1f} s)")
            return
        warm = (result.health or {}).get("warmup_ms")
        render.out.print(
            f"{device}: {result.outcome} {result.release} (was {result.previous or 'none'}) in "
            f"{secs:.1f} s" + (f", warm-up inference {warm:.1f} ms" if warm is not None else "")
        )
        engine = render.engine_summary((result.health or {}).get("runtime") or {})
        if engine:
            render.out.print(f"{device}: {engine}")

    @app.command()
    def rollback(
        device: Annotated[str, typer.Argument(help="device name")],
        timeout: float = 60.0,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Put the device back on its previous bundle."""
        result = api.rollback(Inventory.load(inventory), device, timeout)
        if json_:
            render.print_json(result)
            return
        render.out.print(f"{device}: rolled back to {result['release']} (was {result['previous']})")
