"""The façade the CLI calls: build, inspect, devices, push, rollback, status.

Each function takes plain values, returns plain values and raises EdgeDeployError subclasses.
Nothing here prints or exits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
from .remote.reports import load_local_reports, pull_reports, reports_dir
from .remote.transport import Progress


def build(
    model: Path,
    profile_name: str,
    out: Path,
    card: ModelCard,
    progress: Callable[[str], None] = lambda s: None,
    use_cache: bool = True,
    int8: Int8Config | None = None,
    tune_trials: int = 0,
) -> BuildResult:
    profile = get_profile(profile_name)
    return build_bundle(
        model, profile, out, card, progress=progress, use_cache=use_cache, int8=int8, tune_trials=tune_trials
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
    dev = inv.get(name)
    d = dest or reports_dir(dev.name)
    t = open_transport(dev, inv.known_hosts)
    try:
        f = get_facts(AgentClient(t, dev))
        new = pull_reports(t, dev, d)
    finally:
        t.close()
    return DeviceStatus(dev, f, new, load_local_reports(d))
