"""`edgedeploy verify`: a device's self-test as a checklist, or a fleet's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import InputError, error_code, fleet_exit_code
from ..inventory import Inventory
from . import render
from .options import POSITIVE, InventoryOpt, JsonOpt, ModelOpt

if TYPE_CHECKING:
    from ..remote.fleet import FleetResult
    from ..remote.verify import Checkup


def _show(c: Checkup) -> None:
    from edgedeploy_agent.selftest import checklist_lines

    render.out.print(f"{c.device}: {c.overall}", markup=False)
    for line in checklist_lines(c.as_dict()):
        render.out.print(line, markup=False)


def group_exit_code(fleet: FleetResult[Checkup]) -> int:
    """The fleet commands' exit code (errors.fleet_exit_code: 0 all, 5 some, 1 none), counting a device
    that passed with warnings as passed and an unreachable one as failed."""
    from edgedeploy_agent.selftest import FAILED

    passed = sum(1 for c in fleet.succeeded.values() if c.overall != FAILED)
    return fleet_exit_code(passed, len(fleet.succeeded) + len(fleet.failed))


def register(app: typer.Typer) -> None:
    @app.command()
    def verify(
        device: Annotated[str | None, typer.Argument(help="device name (or --group TAG)")] = None,
        group: Annotated[str | None, typer.Option("--group", help="every device with this tag, in parallel")] = None,
        camera_seconds: Annotated[
            float, typer.Option("--camera-seconds", help="how long to wait for camera frames", callback=POSITIVE)
        ] = 5.0,
        model: ModelOpt = DEFAULT_SLOT,
        inventory: InventoryOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Run the device's self-test through its agent: versions, TVM runtime, bundle vs CPU/GPU/driver,
        TensorRT engine cache, camera frames, power and thermal sensors, disk and spool, clock skew, pinned
        keys, the service and the current release's health (--model NAME: that model slot's release, health,
        source and service). Each line is ok, warning or failed with the fix; the running service is not stopped.

        Exit 0 when nothing failed (warnings allowed), 1 when a check failed. With --group: exit 0 when every
        device passed, 5 when some did (partial: others failed or were unreachable), 1 when none did.
        """
        from edgedeploy_agent.selftest import FAILED

        from .. import field_api

        if (device is None) == (group is None):
            raise InputError("say which device: verify DEVICE, or verify --group TAG")
        inv = Inventory.load(inventory)
        if device is not None:
            checkup = field_api.verify(inv, device, camera_seconds, model)
            if json_:
                render.print_json(checkup.as_dict())
            else:
                _show(checkup)
            raise typer.Exit(1 if checkup.overall == FAILED else 0)
        assert group is not None
        fleet = field_api.verify_fleet(inv, group, camera_seconds, model)
        failed = {n: {"code": error_code(e), "error": e.message} for n, e in sorted(fleet.failed.items())}
        if json_:
            render.print_json(
                {"devices": {n: c.as_dict() for n, c in sorted(fleet.succeeded.items())}, "unreachable": failed}
            )
        else:
            for name in sorted({*fleet.succeeded, *fleet.failed}):
                if name in fleet.succeeded:
                    _show(fleet.succeeded[name])
                else:
                    render.out.print(f"{name}: FAILED [{failed[name]['code']}] {failed[name]['error']}", markup=False)
        raise typer.Exit(group_exit_code(fleet))
