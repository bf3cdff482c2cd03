"""`edgedeploy rollout`: canary first, then waves; halts past the failure threshold; resumable."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import InputError
from ..inventory import Inventory
from . import render
from .options import (
    ConnectTimeoutOpt,
    InventoryOpt,
    IoTimeoutOpt,
    JsonOpt,
    MaxP95Opt,
    MinFpsOpt,
    MinInferencesOpt,
    ModelOpt,
    TimeoutOpt,
    in_range,
)

if TYPE_CHECKING:
    from ..remote.rollout import RolloutState


def _quiet(device: str, status: str, detail: str) -> None:
    return None


def show(state: RolloutState, dry_run: bool) -> None:
    render.out.print(
        f"rollout {state.id}: {state.release} to {len(state.devices)} devices, "
        f"canary {state.canary}, wave {state.wave or 'all'}, max-fail {state.max_fail:.0%} "
        f"(halts at failure #{state.fail_budget + 1}), concurrency {state.concurrency}"
    )
    for w, names in enumerate(state.waves):
        label = "canary" if w == 0 and state.canary else f"wave {w}"
        for n in names:
            d = state.devices[n]
            # plain text: details quote what devices said, which is never markup
            if dry_run:
                render.out.print(f"  {label:8s} {n:16s} {d.detail}", markup=False)
            else:
                code = f" [{d.code}]" if d.code else ""
                after = f" -> runs {d.release_after}" if d.release_after else ""
                render.out.print(f"  {label:8s} {n:16s} {d.status}{code}: {d.detail}{after}", markup=False)
    if not dry_run:
        render.out.print(
            f"{state.status}: {len(state.succeeded)} ok, {len(state.failed)} failed, "
            f"{len(state.untouched)} untouched" + (f" ({state.halted_reason})" if state.halted_reason else ""),
            markup=False,
        )


def register(app: typer.Typer) -> None:
    @app.command()
    def rollout(
        bundle: Annotated[Path | None, typer.Argument(help="bundle file (not with --resume)")] = None,
        group: Annotated[str | None, typer.Option("--group", help="every device with this tag")] = None,
        devices: Annotated[str | None, typer.Option("--devices", help="comma-separated device names")] = None,
        canary: Annotated[
            int, typer.Option(help="devices updated first; any failure among them halts", callback=in_range(0))
        ] = 1,
        wave: Annotated[str | None, typer.Option(help="devices per wave after the canary: N or P%")] = None,
        max_fail: Annotated[str, typer.Option("--max-fail", help="halt once more than P% of devices failed")] = "0%",
        concurrency: Annotated[
            int, typer.Option(help="devices updated at once within a wave", callback=in_range(1))
        ] = 4,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan from the devices' state")] = False,
        resume: Annotated[bool, typer.Option("--resume", help="continue the newest (or --id) rollout")] = False,
        show_: Annotated[bool, typer.Option("--show", help="print the newest (or --id) recorded rollout")] = False,
        rollout_id: Annotated[str | None, typer.Option("--id", help="rollout id for --resume")] = None,
        timeout: TimeoutOpt = 60.0,
        min_inferences: MinInferencesOpt = 0,
        max_p95_ms: MaxP95Opt = None,
        min_fps: MinFpsOpt = None,
        connect_timeout: ConnectTimeoutOpt = 10.0,
        io_timeout: IoTimeoutOpt = 30.0,
        via: Annotated[
            str, typer.Option(help="ssh: push to each device; mqtt: publish desired state (bundle published first)")
        ] = "ssh",
        rate: Annotated[float, typer.Option(help="--via mqtt: desired-state publishes per second")] = 50.0,
        jitter: Annotated[float, typer.Option(help="--via mqtt: devices spread downloads over this many s")] = 0.0,
        pull_timeout: Annotated[
            float, typer.Option("--pull-timeout", help="--via mqtt: download allowance per device, s")
        ] = 300.0,
        model: ModelOpt = DEFAULT_SLOT,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Ship a bundle to a group of devices: canary, then waves (--via ssh: pushed; mqtt: pulled).

        Exit 0 when every device is ok, 5 when some are (partial), 1 when none is; a dry run exits 0.
        """
        from .. import api, pull_api
        from ..remote.plan import HealthPolicy
        from ..remote.rollout import parse_fraction
        from ..remote.rollout_runner import Network

        if via not in ("ssh", "mqtt"):
            raise InputError(f"--via must be ssh or mqtt, got {via!r}")
        if model != DEFAULT_SLOT and (resume or show_):
            raise InputError("--model is for a new rollout; --resume and --show take the recorded one's")
        inv = Inventory.load(inventory)
        if show_:
            state, path = api.load_rollout(rollout_id)
            render.info(f"recorded in {path}")
        elif resume:
            if bundle is not None:
                raise InputError("--resume continues a recorded rollout; give no bundle")
            if dry_run:
                raise InputError("--resume cannot be a dry run; use --show to see what is left")
            state, path = api.load_rollout(rollout_id)
            with render.fleet(f"rollout {state.id} (resumed)", list(state.devices)) as listener:
                if state.options.get("via") == "mqtt":
                    state = pull_api.resume_via_mqtt(inv, state, path, listener=listener)
                else:
                    state = api.resume_rollout(inv, rollout_id, listener=listener)
        else:
            if bundle is None:
                raise InputError("give a bundle file, or --resume")
            names = api.select_devices(inv, devices.split(",") if devices else None, group)
            waves = api.Waves(canary, wave, parse_fraction(max_fail, "--max-fail"))
            live = render.fleet(f"rollout {bundle.name}", names) if not dry_run else nullcontext(_quiet)
            with live as listener:
                if via == "mqtt":
                    state = pull_api.rollout_via_mqtt(
                        inv,
                        bundle,
                        names,
                        waves,
                        health=HealthPolicy(timeout, min_inferences, max_p95_ms, min_fps),
                        rate=rate,
                        jitter_s=jitter,
                        pull_timeout=pull_timeout,
                        dry_run=dry_run,
                        listener=listener,
                        model=model,
                    )
                else:
                    state = api.rollout(
                        inv,
                        bundle,
                        names,
                        waves,
                        concurrency=concurrency,
                        dry_run=dry_run,
                        health=HealthPolicy(timeout, min_inferences, max_p95_ms, min_fps),
                        net=Network(connect_timeout, io_timeout),
                        listener=listener,
                        model=model,
                    )
        if json_:
            render.print_json(state.to_json())
        else:
            show(state, dry_run)
        if show_ and state.status in ("planned", "running", "interrupted", "halted"):
            render.info(f"left to do: {', '.join(state.untouched + state.failed) or 'nothing'}; run `rollout --resume`")
        if not dry_run and state.exit_code():
            raise typer.Exit(state.exit_code())
