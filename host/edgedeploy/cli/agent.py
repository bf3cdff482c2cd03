"""`edgedeploy agent install`: bootstrap the agent on a device over SSH."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import InputError
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
    offline: Annotated[
        Path | None,
        typer.Option(help="install only from this wheelhouse (`edgedeploy agent wheelhouse`): no network needed"),
    ] = None,
    system_site_packages: Annotated[
        bool, typer.Option(help="let the venv see the system's packages (a GStreamer OpenCV)")
    ] = False,
    system_python: Annotated[
        str,
        typer.Option(
            help="the system Python with TensorRT / GStreamer OpenCV for the agent's sidecar: auto (JetPack's "
            "/usr/bin/python3.8 on a Jetson), a path, or none"
        ),
    ] = "auto",
    mqtt: Annotated[
        str | None, typer.Option(help="pull rollouts: the MQTT broker HOST:PORT as the device reaches it")
    ] = None,
    registry: Annotated[
        str | None, typer.Option(help="with --mqtt: the device's read-only registry endpoint, e.g. http://cache:5000")
    ] = None,
    rollout_key: Annotated[
        str | None, typer.Option(help="with --mqtt: key that signs desired state (default: fleet.toml's \\[rollout])")
    ] = None,
    mqtt_ca: Annotated[Path | None, typer.Option(help="with --mqtt: fleet CA; the device uses TLS")] = None,
    broker_passwd: Annotated[
        Path | None, typer.Option(help="with --mqtt: mosquitto password file here to add the device's user to")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the steps; change nothing")] = False,
    inventory: InventoryOpt = None,
    json_: JsonOpt = False,
) -> None:
    """Create the user and folders, install the agent and its TVM runtime in a venv, install the systemd
    unit, start it and check health. With --mqtt, also the watch service for pull rollouts (docs/fleet.md).
    Running it again changes nothing."""
    from .. import api, pull_api
    from ..remote.install import InstallOptions

    if offline is not None and wheelhouse is not None:
        raise InputError("give --offline DIR or --wheelhouse DIR, not both")
    pull = pull_api.pull_install_options(mqtt, registry, rollout_key, mqtt_ca, broker_passwd)
    with render.steps(f"install {device}") as step:
        options = InstallOptions(
            python=python,
            venv=venv,
            wheelhouse=offline or wheelhouse,
            runtime_lib=runtime_lib,
            offline=offline is not None,
            system_site_packages=system_site_packages,
            system_python=None if system_python.lower() == "none" else system_python,
            pull=pull,
        )
        res = api.install_agent(Inventory.load(inventory), device, options, dry_run=dry_run, step=step)
    if json_:
        render.print_json(res)
        return
    steps = res["steps"] if dry_run else res["changed"]
    verb = "would do" if dry_run else "changed"
    render.out.print(f"{device}: {verb}: {', '.join(steps) if steps else 'nothing (already installed)'}")
    if not dry_run:
        render.out.print(f"  agent {res['agent_command']}; OpenCV {res['opencv']}; healthy: {res['healthy']}")
        render.out.print(f"  CUDA backend (edgedeploy's, CUDA 11.4+ drivers): {res['cuda_backend']}")
        render.out.print(f"  system Python: {res['system_python']}", markup=False)
        if res.get("broker_user"):
            u = res["broker_user"]
            where = f"added to {u['added_to']}: reload the broker" if u["added_to"] else "add it to the broker"
            render.out.print(f"  broker user {u['user']}: password in {u['password_file']}; {where}")


@app.command()
def wheelhouse(
    out: Annotated[Path, typer.Argument(help="folder to fill (a USB stick, a laptop folder)")],
    python: Annotated[str, typer.Option(help="the device's Python, MAJOR.MINOR (3.9 on JetPack 5)")] = "3.9",
    platform: Annotated[
        str, typer.Option(help="wheel platform: manylinux_2_28_x86_64, or manylinux_2_28_aarch64 for a Jetson")
    ] = "manylinux_2_28_x86_64",
    extra: Annotated[
        list[str] | None, typer.Option("--extra", help="also: agent-metrics, agent-nvidia, tensorrt (repeatable)")
    ] = None,
    json_: JsonOpt = False,
) -> None:
    """Download the agent and every wheel it needs for one device Python and platform into a folder (this
    host needs PyPI), for `edgedeploy agent install DEVICE --offline FOLDER` on a device without a network."""
    from .. import field_api

    house = field_api.wheelhouse(out, python, platform, tuple(extra or ()))
    if json_:
        render.print_json(house.__dict__)
        return
    size = sum((out / w).stat().st_size for w in house.wheels) / 1e6
    render.out.print(
        f"{out}: {len(house.wheels)} wheels ({size:.1f} MB) for Python {house.python} on {house.platform} "
        f"in {house.download_s:.0f} s; install with `edgedeploy agent install DEVICE --offline {out}`",
        markup=False,
    )
    render.out.print(f"  CUDA backend (edgedeploy's, CUDA 11.4+ drivers): {house.cuda_backend}", markup=False)
