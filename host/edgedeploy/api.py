"""The façade the CLI calls: build, inspect, devices, push, rollback, status.

Each function takes plain values, returns plain values and raises EdgeDeployError subclasses.
Nothing here prints or exits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import Manifest, read_manifest
from edgedeploy_agent.errors import AgentError

from .compile.int8_build import Int8Config
from .compile.package import BuildResult, ModelCard, build_bundle
from .compile.tensorrt_artifacts import TensorRTOptions
from .errors import ConnectionFailed, InputError
from .inventory import Device, Inventory
from .profiles import get_profile
from .remote.agent_client import AgentClient
from .remote.connect import open_transport
from .remote.execute import PushResult, get_facts, init_agent, push
from .remote.execute import rollback as _rollback
from .remote.facts import DeviceFacts
from .remote.fleet import FleetResult, run_fleet
from .remote.reports import load_local_reports, pull_reports, reports_dir
from .remote.transport import Progress


def build(
    model: Path,
    profile_name: str,
    out: Path,
    card: ModelCard,
    progress: Callable[[str], None] = lambda s: None,
    use_cache: bool = True,
    precision: str = "fp32",
    cuda_graph: bool = True,
    batch: int = 1,
    int8: Int8Config | None = None,
    tune_trials: int = 0,
) -> BuildResult:
    profile = get_profile(profile_name)
    return build_bundle(
        model,
        profile,
        out,
        card,
        progress=progress,
        use_cache=use_cache,
        precision=precision,
        cuda_graph=cuda_graph,
        batch=batch,
        int8=int8,
        tune_trials=tune_trials,
    )


def build_tensorrt(
    model: Path,
    profile_name: str,
    out: Path,
    card: ModelCard,
    int8: Int8Config,
    options: TensorRTOptions,
    progress: Callable[[str], None] = lambda s: None,
) -> BuildResult:
    """A TensorRT bundle: INT8 Q/DQ ONNX, shape profiles, builder settings, reference outputs; no engine."""
    from .compile.tensorrt_artifacts import build_tensorrt_bundle

    profile = get_profile(profile_name)
    return build_tensorrt_bundle(model, profile, out, card, int8, options, progress=progress)


def evaluate(
    target: Path,
    data: Path,
    card: ModelCard,
    split: str = "auto",
    limit: int | None = None,
    synsets: Path | None = None,
) -> dict[str, Any]:
    """Top-1/top-5 of a bundle (TVM library vs onnxruntime FP32 and INT8) or of an ONNX model."""
    from .evaluate import evaluate_target

    return evaluate_target(target, data, card.preprocess, card.postprocess.label_offset, split, limit, synsets)


def inspect_bundle(path: Path) -> Manifest:
    try:
        return read_manifest(path)
    except AgentError as e:
        raise InputError(e.message, hint=e.hint) from None


def enroll(
    inv: Inventory,
    name: str,
    expect_fingerprint: str | None = None,
    replace: bool = False,
    confirm: Callable[[str], bool] = lambda fp: True,
) -> dict[str, Any]:
    """Pin the device's host key (shown to the technician), then initialise the agent root."""
    dev = inv.get(name)
    fp: str | None = None
    if dev.transport == "ssh":
        from .remote.ssh import fetch_host_key, fingerprint, pin_host_key, pinned_fingerprint

        key = fetch_host_key(dev.host, dev.port)
        fp = fingerprint(key)
        pinned = pinned_fingerprint(inv.known_hosts, dev.host, dev.port)
        if expect_fingerprint and expect_fingerprint != fp:
            raise ConnectionFailed(f"{name}: device offers {fp}, you expected {expect_fingerprint}; not pinned")
        if pinned and pinned != fp and not replace:
            raise ConnectionFailed(
                f"{name}: device now offers {fp} but {pinned} is pinned",
                hint="if the device was reinstalled, check the fingerprint and run with --replace",
            )
        if pinned != fp:
            if not confirm(fp):
                raise InputError(f"{name}: host key not accepted; nothing pinned")
            pin_host_key(inv.known_hosts, dev.host, dev.port, key)
    t = open_transport(dev, inv.known_hosts)
    try:
        info = init_agent(t, dev)
        facts = get_facts(AgentClient(t, dev))
    finally:
        t.close()
    return {
        "device": name,
        "fingerprint": fp,
        "root": info["root"],
        "arch": facts.arch,
        "python": facts.python,
        "agent_version": facts.agent_version,
    }


def facts(inv: Inventory, name: str) -> DeviceFacts:
    dev = inv.get(name)
    t = open_transport(dev, inv.known_hosts)
    try:
        return get_facts(AgentClient(t, dev))
    finally:
        t.close()


def push_bundle(
    inv: Inventory,
    name: str,
    bundle: Path,
    *,
    dry_run: bool = False,
    force: bool = False,
    timeout: float = 60.0,
    progress: Progress | None = None,
    step: Callable[[str], None] = lambda s: None,
    build_timeout: float | None = None,
) -> PushResult:
    dev = inv.get(name)
    if not bundle.is_file():
        raise InputError(f"bundle file {bundle} does not exist")
    inspect_bundle(bundle)
    step("connect")
    t = open_transport(dev, inv.known_hosts)
    try:
        return push(
            t,
            dev,
            bundle,
            dry_run=dry_run,
            force=force,
            timeout=timeout,
            progress=progress,
            step=step,
            build_timeout=build_timeout,
        )
    finally:
        t.close()


def rollback(inv: Inventory, name: str, timeout: float = 60.0) -> dict[str, Any]:
    dev = inv.get(name)
    t = open_transport(dev, inv.known_hosts)
    try:
        return _rollback(t, dev, timeout)
    finally:
        t.close()


@dataclass
class DeviceStatus:
    device: Device
    facts: DeviceFacts
    new_reports: list[dict[str, Any]]
    reports: list[dict[str, Any]]


def status(inv: Inventory, name: str, dest: Path | None = None) -> DeviceStatus:
    """Pull new reports over the device's transport and return them with everything pulled before."""
    return _device_status(inv, inv.get(name), dest)


def fleet_status(inv: Inventory, tag: str | None = None) -> FleetResult[DeviceStatus]:
    """status() for every device (or those tagged `tag`), in parallel; failures are per device."""
    devices = inv.select(tag=tag)
    if not devices:
        where = f"tagged {tag!r}" if tag else "in the inventory"
        raise InputError(f"no devices {where} ({inv.path})", hint="add one with `edgedeploy devices add`")
    return run_fleet(devices, lambda d: _device_status(inv, d, None))


def stored_reports(inv: Inventory, name: str) -> list[dict[str, Any]]:
    """The reports already pulled from a device, oldest first (no connection)."""
    return load_local_reports(reports_dir(inv.get(name).name))


def plot_device_reports(device: str, reports: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    from .plot import plot_reports  # matplotlib only when a plot is asked for

    return plot_reports(device, reports, out)


def _device_status(inv: Inventory, dev: Device, dest: Path | None) -> DeviceStatus:
    d = dest or reports_dir(dev.name)
    t = open_transport(dev, inv.known_hosts)
    try:
        f = get_facts(AgentClient(t, dev))
        new = pull_reports(t, dev, d)
    finally:
        t.close()
    return DeviceStatus(dev, f, new, load_local_reports(d))


def install_agent(
    inv: Inventory,
    name: str,
    *,
    python: str = "python3",
    venv: str = "/opt/edgedeploy/venv",
    wheelhouse: Path | None = None,
    runtime_lib: Path | None = None,
    offline: bool = False,
    system_site_packages: bool = False,
    dry_run: bool = False,
    step: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Bootstrap the agent on a device (user, venv, agent, TVM runtime, unit), then point the inventory at it."""
    import tempfile

    from .remote.install import InstallSpec, execute_install, plan_install, probe, write_install_files
    from .remote.wheels import agent_wheels, default_runtime_lib

    dev = inv.get(name)
    with tempfile.TemporaryDirectory() as tmp:
        step("agent wheel")
        wheels = agent_wheels(Path(tmp), wheelhouse)
        spec = InstallSpec(
            python=python,
            venv=venv,
            root=dev.root,
            mode=dev.service,
            user=dev.user if dev.service == "process" else "edgedeploy",
            wheels=tuple(wheels),
            runtime_lib=runtime_lib,
            system_site_packages=system_site_packages,
            offline=offline,
            source=dev.source,
            login_user=dev.user,
        )
        step("connect")
        t = open_transport(dev, inv.known_hosts)
        try:
            facts = probe(t, spec)
            if spec.runtime_lib is None:
                spec = replace(spec, runtime_lib=default_runtime_lib(facts.arch))
            if dry_run:
                steps = plan_install(facts, spec, *write_install_files(spec, Path(tmp)))
                return {"device": name, "dry_run": True, "steps": [s.name for s in steps], "facts": facts.__dict__}
            result = execute_install(t, dev, spec, step=step, work_dir=Path(tmp))
        finally:
            t.close()
    if dev.agent_command != result.agent_command:
        inv.add(dev.model_copy(update={"agent_command": result.agent_command}), replace=True)
    return {
        "device": name,
        "changed": result.steps,
        "agent_command": result.agent_command,
        "opencv": result.opencv,
        "healthy": bool(result.health.get("ok") and result.health.get("initialised")),
        "facts": result.facts.__dict__,
    }
