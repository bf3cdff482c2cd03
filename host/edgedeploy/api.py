"""The façade the CLI calls: build, inspect, devices, push, rollback, status.

Each function takes plain values, returns plain values and raises EdgeDeployError subclasses.
Nothing here prints or exits.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import Manifest, read_manifest

from .compile.cards import ModelCard
from .compile.int8_build import Int8Config
from .compile.manifest import BuildResult
from .compile.tensorrt_artifacts import TensorRTOptions
from .compile.tune_bundle import TuneResult
from .compile.tuning import TuneRequest
from .errors import EdgeDeployError, InputError, agent_input, error_code
from .inventory import Device, Inventory
from .profiles import get_profile
from .remote.agent_client import AgentClient
from .remote.blobs import bundle_blobs
from .remote.connect import connected
from .remote.enroll import enroll as enroll  # `devices enroll`: pin the host key, init the agent
from .remote.execute import PushResult, get_facts, install_keys, push
from .remote.execute import rollback as _rollback
from .remote.execute import stop_agent as stop_agent_on
from .remote.execute import wait_finished as wait_finished_on
from .remote.facts import DeviceFacts
from .remote.fleet import FleetResult, run_fleet
from .remote.install_run import install_agent as install_agent  # `agent install`: one probe, plan, execute
from .remote.plan import HealthPolicy
from .remote.reports import load_local_reports, pull_reports, reports_dir
from .remote.rollout import RolloutState, plan_rollout
from .remote.rollout_runner import (
    Listener,
    Network,
    RolloutRunner,
    device_log,
    prepare_resume,
    rollouts_dir,
)
from .remote.transport import Progress
from .signing import fleet_public_keys

DEFAULT_HEALTH = HealthPolicy()
DEFAULT_NET = Network()


def build(
    model: Path,
    profile_name: str,
    out: Path,
    card: ModelCard,
    progress: Callable[[str], None] = lambda s: None,
    **options: Any,
) -> BuildResult:
    """A bundle for either runtime (compile.build_options.build_for_runtime's options: runtime, batch,
    precision, cuda_graph, use_cache, int8, workspace_mib)."""
    from .compile.build_options import build_for_runtime

    return build_for_runtime(model, get_profile(profile_name), out, card, progress=progress, **options)


def tune(
    bundle: Path, request: TuneRequest, progress: Callable[[str], None] = lambda s: None, sources: Sequence[Path] = ()
) -> TuneResult:
    """Tune the kernels of what `bundle` was built from (found in the build store, or `sources`); the
    database is applied by later builds."""
    from .compile.tune_bundle import tune_model

    with agent_input():
        return tune_model(bundle, request, progress, sources)


def tune_request(bundle: Path, manifest: Manifest, *options: Any) -> TuneRequest:
    """`edgedeploy tune`'s options checked into a request (compile.tune_bundle.tune_request)."""
    from .compile.tune_bundle import tune_request as make_request

    return make_request(bundle, manifest, *options)


def import_tuning(folder: Path, database: Path | None = None) -> tuple[Path, int]:
    """Store the database that tune_offline wrote into `folder` (default: the user's database for the
    exported profile and model); returns where, and how many records it holds now."""
    from .compile.tuning import import_database

    return import_database(folder, database)


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
    sources: Sequence[Path] = (),
) -> dict[str, Any]:
    """Top-1/top-5 of a bundle (TVM library vs onnxruntime FP32 and the exact INT8 reference) or of an ONNX
    model. A bundle's source and QDQ model come from the build store, or `sources` (checked by sha256)."""
    from .build_store import check_given
    from .evaluate import evaluate_target

    if target.suffix != ".onnx":
        check_given(inspect_bundle(target), sources)  # before any image is scored
    elif sources:
        raise InputError("--source is for bundles; an ONNX model is evaluated as it is")
    return evaluate_target(target, data, card.preprocess, card.postprocess.label_offset, split, limit, synsets, sources)


def inspect_bundle(path: Path) -> Manifest:
    with agent_input():
        return read_manifest(path)


def facts(inv: Inventory, name: str) -> DeviceFacts:
    dev = inv.get(name)
    with connected(dev, inv.known_hosts) as t:
        return get_facts(AgentClient(t, dev))


def wait_finished(inv: Inventory, name: str, timeout: float) -> str | None:
    """Until the device's agent has ended its run (finished, failed, stopped): that state, or None."""
    dev = inv.get(name)
    with connected(dev, inv.known_hosts) as t:
        return wait_finished_on(AgentClient(t, dev), timeout)


def stop_agent(inv: Inventory, name: str) -> None:
    """Best effort (at exit): stop the device's agent; an unreachable device is left as it is."""
    dev = inv.get(name)
    try:
        with connected(dev, inv.known_hosts) as t:
            stop_agent_on(AgentClient(t, dev))
    except EdgeDeployError:
        pass


def push_bundle(
    inv: Inventory,
    name: str,
    bundle: Path,
    *,
    dry_run: bool = False,
    force: bool = False,
    health: HealthPolicy = DEFAULT_HEALTH,
    net: Network = DEFAULT_NET,
    progress: Progress | None = None,
    step: Callable[[str], None] = lambda s: None,
) -> PushResult:
    dev = inv.get(name)
    blobs = bundle_blobs(_existing(bundle))
    step("connect")
    device_log(name, f"push {blobs.manifest.release_name}{' (dry run)' if dry_run else ''}")
    try:
        with connected(dev, inv.known_hosts, net.connect_timeout, net.io_timeout) as t:
            r = push(t, dev, blobs, dry_run=dry_run, force=force, health=health, progress=progress, step=step)
    except EdgeDeployError as e:
        device_log(name, f"push failed [{error_code(e)}]: {e.message}")
        raise
    device_log(name, f"push {r.outcome} {r.release}, sent {r.uploaded_bytes} bytes, timings {r.timings}")
    return r


def _existing(bundle: Path) -> Path:
    if not bundle.is_file():
        raise InputError(f"bundle file {bundle} does not exist")
    return bundle


def rollback(inv: Inventory, name: str, timeout: float = 60.0) -> dict[str, Any]:
    dev = inv.get(name)
    with connected(dev, inv.known_hosts) as t:
        result = _rollback(t, dev, timeout)
    device_log(name, f"manual rollback to {result.get('release')} (was {result.get('previous')})")
    return result


def rollback_fleet(inv: Inventory, names: list[str], timeout: float = 60.0) -> FleetResult[dict[str, Any]]:
    """rollback() on each device in parallel; one failure never hides the others."""

    def one(dev: Device) -> dict[str, Any]:
        try:
            return rollback(inv, dev.name, timeout)
        except EdgeDeployError as e:
            device_log(dev.name, f"manual rollback failed [{error_code(e)}]: {e.message}")
            raise

    return run_fleet(inv.select(names), one)


def install_fleet_keys(inv: Inventory, names: list[str]) -> FleetResult[list[str]]:
    """Pin the host's public signing keys (current + next) on each device; returns the pinned key names."""
    keys = fleet_public_keys()
    if not keys:
        raise InputError("no signing keys on this host", hint="run `edgedeploy keys generate NAME` first")

    def one(dev: Device) -> list[str]:
        with connected(dev, inv.known_hosts) as t:
            pinned: list[str] = install_keys(t, dev, keys)
        device_log(dev.name, f"pinned signing keys {pinned}")
        return pinned

    return run_fleet(inv.select(names), one)


def select_devices(inv: Inventory, names: list[str] | None, tag: str | None) -> list[str]:
    if not names and not tag:
        raise InputError("say which devices: --group TAG or --devices a,b,c")
    chosen = [d.name for d in inv.select(names, tag)]
    if not chosen:
        raise InputError(f"no device in {inv.path} has tag {tag!r}")
    return chosen


def _gather_facts(inv: Inventory, names: list[str], net: Network) -> dict[str, DeviceFacts | str]:
    """Each device's facts, or why there are none (one device's error never stops the others)."""

    def one(name: str) -> DeviceFacts:
        dev = inv.get(name)  # an unknown name fails on its own
        with connected(dev, inv.known_hosts, net.connect_timeout, net.io_timeout) as t:
            return get_facts(AgentClient(t, dev))

    result = run_fleet(names, one, name=str)
    return {n: result.succeeded[n] if n in result.succeeded else result.failed[n].message for n in names}


def rollout(
    inv: Inventory,
    bundle: Path,
    names: list[str],
    *,
    canary: int = 1,
    wave: str | None = None,
    max_fail: float = 0.0,
    concurrency: int = 4,
    dry_run: bool = False,
    health: HealthPolicy = DEFAULT_HEALTH,
    net: Network = DEFAULT_NET,
    listener: Listener = lambda d, s, m: None,
) -> RolloutState:
    """Plan from the devices' current facts; unless dry_run, execute it with its state kept on disk."""
    blobs = bundle_blobs(_existing(bundle))
    rid = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + f"-{blobs.manifest.bundle_id[:8]}"
    # a dry run shows what each device would do now; a real run reads each device's facts right
    # before acting on it (push does), so it does not ask every device twice
    state = plan_rollout(
        rid,
        str(bundle.resolve()),
        blobs.manifest.release_name,
        names,
        _gather_facts(inv, names, net) if dry_run else {},
        canary=canary,
        wave=wave,
        max_fail=max_fail,
        concurrency=concurrency,
    )
    state.options = {"health": asdict(health), "net": asdict(net)}
    if dry_run:
        return state
    return RolloutRunner(inv, state, blobs, rollouts_dir() / f"{rid}.json", health, net, listener).run()


def load_rollout(rollout_id: str | None = None) -> tuple[RolloutState, Path]:
    """The named rollout, or the newest one."""
    d = rollouts_dir()
    files = sorted(d.glob("*.json")) if d.is_dir() else []
    if rollout_id:
        files = [p for p in files if p.stem == rollout_id]
    if not files:
        raise InputError(f"no rollout {rollout_id or ''} recorded in {d}".replace("  ", " "))
    path = files[-1]
    try:
        return RolloutState.from_json(json.loads(path.read_text(encoding="utf-8"))), path
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"rollout state {path} is unreadable: {e}") from None


def resume_rollout(
    inv: Inventory, rollout_id: str | None = None, listener: Listener = lambda d, s, m: None
) -> RolloutState:
    """Run again what an interrupted or halted rollout left: devices that did not end ok."""
    state, path = load_rollout(rollout_id)
    blobs = bundle_blobs(_existing(Path(state.bundle)))
    if blobs.manifest.release_name != state.release:
        raise InputError(f"{state.bundle} changed since the rollout started ({state.release})")
    health = HealthPolicy(**state.options.get("health", {}))
    net = Network(**state.options.get("net", {}))
    return RolloutRunner(inv, prepare_resume(state), blobs, path, health, net, listener).run()


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
    with connected(dev, inv.known_hosts) as t:
        f = get_facts(AgentClient(t, dev))
        new = pull_reports(t, dev, d)
    return DeviceStatus(dev, f, new, load_local_reports(d))
