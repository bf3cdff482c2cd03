"""`edgedeploy push` and `edgedeploy rollback`."""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import InputError
from ..inventory import Inventory
from . import render
from .options import (
    POSITIVE,
    ConnectTimeoutOpt,
    InventoryOpt,
    IoTimeoutOpt,
    JsonOpt,
    MaxP95Opt,
    MinFpsOpt,
    MinInferencesOpt,
    ModelOpt,
    TimeoutOpt,
)


def register(app: typer.Typer) -> None:
    @app.command()
    def push(
        device: Annotated[str, typer.Argument(help="device name from the inventory")],
        bundle: Annotated[Path, typer.Argument(help="bundle file")],
        dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan, change nothing")] = False,
        force: Annotated[bool, typer.Option(help="redeploy even if the device already runs this bundle")] = False,
        timeout: TimeoutOpt = 60.0,
        min_inferences: MinInferencesOpt = 0,
        max_p95_ms: MaxP95Opt = None,
        min_fps: MinFpsOpt = None,
        connect_timeout: ConnectTimeoutOpt = 10.0,
        io_timeout: IoTimeoutOpt = 30.0,
        prebuild: Annotated[
            bool, typer.Option("--prebuild", help="TensorRT: the health check waits for the engine build")
        ] = False,
        build_timeout: Annotated[
            float, typer.Option(help="--prebuild: seconds allowed for the engine build", callback=POSITIVE)
        ] = 1800.0,
        model: ModelOpt = DEFAULT_SLOT,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Upload the blobs the device lacks, activate atomically, health-check; the device rolls back on failure.

        With --model NAME the bundle goes into that model slot of the device (created by its first push), with
        the source the inventory names for it (\\[devices.DEVICE.models.NAME] source); the others keep serving."""
        from .. import api
        from ..remote.plan import HealthPolicy
        from ..remote.rollout_runner import Network

        inv = Inventory.load(inventory)
        t = time.perf_counter()
        health = HealthPolicy(timeout, min_inferences, max_p95_ms, min_fps, build_timeout if prebuild else None)
        with render.transfer(f"upload {bundle.name}") as progress, render.steps(f"push {device}") as step:
            options = api.PushOptions(
                dry_run=dry_run, force=force, health=health, progress=progress, step=step, model=model
            )
            result = api.push_bundle(inv, device, bundle, options, Network(connect_timeout, io_timeout))
        secs = time.perf_counter() - t
        if json_:
            render.print_json({**dataclasses.asdict(result), "seconds": round(secs, 3)})
            return
        if dry_run:
            for a in result.actions:
                render.out.print(f"{'no-op' if a.noop else 'will'}  {a.kind:7s} {a.detail}")
                for local, remote in a.puts:
                    render.out.print(f"         put {local.name} -> {remote}")
                if a.argv and not a.noop:
                    render.out.print(f"         run {shlex.join(a.argv)}")
            return
        if result.outcome == "unchanged":
            render.out.print(f"{device}: already running {result.release}, nothing to do ({secs:.1f} s)")
            return
        render.info(f"{device}: sent {result.uploaded_bytes / 1e6:.2f} MB (blobs the device lacked)")
        warm = (result.health or {}).get("warmup_ms")
        render.out.print(
            f"{device}{_of(model)}: {result.outcome} {result.release} (was {result.previous or 'none'}) in "
            f"{secs:.1f} s" + (f", warm-up inference {warm:.1f} ms" if warm is not None else "")
        )
        engine = render.engine_summary((result.health or {}).get("runtime") or {})
        if engine:
            render.out.print(f"{device}: {engine}")

    @app.command()
    def rollback(
        device: Annotated[str | None, typer.Argument(help="device name (or --group)")] = None,
        group: Annotated[str | None, typer.Option("--group", help="every device with this tag")] = None,
        timeout: TimeoutOpt = 60.0,
        via: Annotated[
            str,
            typer.Option(
                help="ssh: ask each device; mqtt: send each device back to what it ran before the last mqtt rollout"
            ),
        ] = "ssh",
        model: ModelOpt = DEFAULT_SLOT,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Put a device, or every device of a group, back on its previous bundle (--model: of that model slot).

        One device over ssh: an error exits with its code (3 unreachable, 4 refused). A group, or --via mqtt:
        exit 0 when every device rolled back, 5 when some did (partial), 1 when none did.
        """
        from .. import api, pull_api

        inv = Inventory.load(inventory)
        if via == "mqtt":  # one deadline for all: the health check, plus a margin for the broker round trip
            names = api.select_devices(inv, [device] if device else None, group)
            fleet = pull_api.rollback_via_mqtt(names, health_timeout=timeout, model=model)
            render.fleet_result(fleet, json_, _rolled_back)
            if fleet.exit_code:
                raise typer.Exit(fleet.exit_code)
            return
        if via != "ssh":
            raise InputError(f"--via must be ssh or mqtt, got {via!r}")
        if device and not group:  # one device: its failure is the command's error (one line, exit 3/4)
            result = api.rollback(inv, device, timeout, model)
            if json_:
                render.print_json(result)
            else:
                render.out.print(f"{device}{_of(model)}: rolled back to {result['release']} (was {result['previous']})")
            return
        names = api.select_devices(inv, [device] if device else None, group)
        fleet = api.rollback_fleet(inv, names, timeout, model)
        render.fleet_result(fleet, json_, _rolled_back)
        if fleet.exit_code:
            raise typer.Exit(fleet.exit_code)


def _of(model: str) -> str:
    return "" if model == DEFAULT_SLOT else f" model {model}"


def _rolled_back(r: dict[str, Any]) -> str:
    """One device's rollback result, SSH or MQTT (MQTT: `unchanged` when it already ran that release)."""
    if r.get("outcome") == "unchanged":
        return f"already on {r['release']}, nothing to do"
    return f"rolled back to {r['release']} (was {r['previous']})"
