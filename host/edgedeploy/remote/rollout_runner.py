"""The rollout executor: runs a RolloutState wave by wave, threads within a wave, state on disk.

One bad device never hides the others: each device's failure is caught and recorded with its reason
and code. The rollout halts (devices not started stay untouched) when a canary fails or more
devices failed than the budget allows. The state file is rewritten after every device.
`rollout`, `resume_rollout` and `load_rollout` are the SSH rollout's entry points (pull_api.py: MQTT's).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import EdgeDeployError, InputError, error_code
from ..inventory import Inventory
from ..paths import state_dir
from .agent_client import AgentClient
from .blobs import BundleBlobs, bundle_blobs
from .connect import connected
from .execute import PushOptions, get_facts, push
from .facts import DeviceFacts
from .fleet import run_fleet
from .plan import DEFAULT_HEALTH, HealthPolicy
from .rollout import DEFAULT_WAVES, FINAL_OUTCOMES, OK_OUTCOMES, RolloutState, Waves, new_rollout_id, plan_rollout

# (device, status, detail) after every change; the renderer draws it
Listener = Callable[[str, str, str], None]


@dataclass(frozen=True)
class Network:
    connect_timeout: float = 10.0
    io_timeout: float = 30.0


DEFAULT_NET = Network()


def rollouts_dir() -> Path:
    return state_dir() / "rollouts"


def device_log(device: str, line: str) -> None:
    """Append to the host's log of what was done on one device."""
    path = state_dir() / "logs" / "devices" / f"{device}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{stamp} {line}\n")


def read_release(inv: Inventory, name: str, net: Network, model: str = DEFAULT_SLOT) -> str | None:
    """What the device runs now in model slot `model`, as it says (None when it cannot be asked)."""
    try:
        with connected(inv.get(name), inv.known_hosts, net.connect_timeout, net.io_timeout) as t:
            return get_facts(AgentClient(t, inv.get(name)), model).current_release
    except EdgeDeployError:
        return None


class RolloutRunner:
    def __init__(
        self,
        inv: Inventory,
        state: RolloutState,
        blobs: BundleBlobs,
        path: Path,
        health: HealthPolicy,
        net: Network = DEFAULT_NET,
        listener: Listener = lambda d, s, m: None,
        model: str = DEFAULT_SLOT,
    ) -> None:
        self.inv, self.state, self.blobs, self.path = inv, state, blobs, path
        self.health, self.net, self.listener, self.model = health, net, listener, model
        self._lock = threading.Lock()
        self._halt: str | None = None
        self._saved = 0.0

    # seconds between state-file rewrites while devices change (run() always writes the last state). 0 for
    # SSH: every device change is on disk. A 1,000-device state takes ~0.06 s to write (bench/fleet_pull.py).
    save_interval = 0.0

    def _set(self, name: str, status: str, detail: str, **extra: object) -> None:
        with self._lock:
            d = self.state.devices[name]
            d.status, d.detail = status, detail
            for k, v in extra.items():
                setattr(d, k, v)
            if time.monotonic() - self._saved >= self.save_interval:
                self.state.save(self.path)
                self._saved = time.monotonic()
        device_log(name, f"rollout {self.state.id}: {status}: {detail}")
        self.listener(name, status, detail)

    def _step(self, name: str, step: str) -> None:
        device_log(name, f"rollout {self.state.id}: {step}")
        self.listener(name, "running", step)

    def _one(self, name: str, wave: int) -> None:
        if self._halt:
            self._set(name, "skipped", f"not started: rollout halted ({self._halt})")
            return
        self._set(name, "running", "connecting")
        t0 = time.monotonic()
        try:
            outcome, detail, after = self._deliver(name)
            self._set(name, outcome, detail, code=None, release_after=after, seconds=_secs(t0))
        except Exception as e:  # one device's surprise (a bug) is its failure, never the rollout's
            err = e if isinstance(e, EdgeDeployError) else EdgeDeployError(f"{name}: {type(e).__name__}: {e}")
            after = self._release_after_failure(name)
            self._set(name, "failed", err.message, code=error_code(err), release_after=after, seconds=_secs(t0))
            self._check_threshold(wave)

    def _deliver(self, name: str) -> tuple[str, str, str | None]:
        """Bring one device to the bundle: (outcome, detail, release it runs after); raises on failure.
        This class pushes over SSH; mqtt_rollout.py publishes desired state instead."""
        dev = self.inv.get(name)
        with connected(dev, self.inv.known_hosts, self.net.connect_timeout, self.net.io_timeout) as t:
            options = PushOptions(health=self.health, step=lambda s: self._step(name, s), model=self.model)
            r = push(t, dev, self.blobs, options)
        detail = f"{r.outcome} {r.release} (was {r.previous or 'none'}), sent {r.uploaded_bytes / 1e6:.2f} MB"
        return r.outcome, detail, r.release

    def _release_after_failure(self, name: str) -> str | None:
        return read_release(self.inv, name, self.net, self.model)

    def _check_threshold(self, wave: int) -> None:
        with self._lock:
            failed = len(self.state.failed)
            if self._halt:
                return
            if wave == 0 and self.state.canary > 0:
                self._halt = f"canary device failed ({failed} failed)"
            elif failed > self.state.fail_budget:
                self._halt = f"{failed} devices failed, more than --max-fail allows ({self.state.fail_budget})"

    def _interrupted(self) -> None:
        self._halt = "interrupted"

    def run(self) -> RolloutState:
        self.state.status = "running"
        self.state.save(self.path)
        try:
            for w, names in enumerate(self.state.waves):
                todo = [n for n in names if self.state.devices[n].status not in FINAL_OUTCOMES]
                # Ctrl-C: devices already in flight finish their step (a pull rollout stops waiting for
                # them); the rest are recorded as skipped, and `rollout --resume` picks them up
                run_fleet(todo, partial(self._one, wave=w), self.state.concurrency, str, self._interrupted)
        except KeyboardInterrupt:
            self.state.status, self.state.halted_reason = "interrupted", "interrupted (Ctrl-C)"
            self.state.save(self.path)
            raise
        self.state.status = "halted" if self._halt else "done"
        self.state.halted_reason = self._halt
        self.state.save(self.path)
        return self.state


def prepare_resume(state: RolloutState) -> RolloutState:
    """Devices that did not end ok (interrupted, failed, skipped) run again; the halt is lifted."""
    for d in state.devices.values():
        if d.status not in OK_OUTCOMES:
            d.status = "pending"
    state.halted_reason = None
    return state


def gather_facts(
    inv: Inventory, names: list[str], net: Network, model: str = DEFAULT_SLOT
) -> dict[str, DeviceFacts | str]:
    """Each device's facts (model slot `model` at the top), or why there are none (one device's error never
    stops the others)."""

    def one(name: str) -> DeviceFacts:
        dev = inv.get(name)  # an unknown name fails on its own
        with connected(dev, inv.known_hosts, net.connect_timeout, net.io_timeout) as t:
            return get_facts(AgentClient(t, dev), model)

    result = run_fleet(names, one, name=str)
    return {n: result.succeeded[n] if n in result.succeeded else result.failed[n].message for n in names}


def rollout(
    inv: Inventory,
    bundle: Path,
    names: list[str],
    waves: Waves = DEFAULT_WAVES,
    *,
    concurrency: int = 4,
    dry_run: bool = False,
    health: HealthPolicy = DEFAULT_HEALTH,
    net: Network = DEFAULT_NET,
    listener: Listener = lambda d, s, m: None,
    model: str = DEFAULT_SLOT,
) -> RolloutState:
    """Plan from the devices' current facts; unless dry_run, execute it with its state kept on disk. The bundle
    goes into model slot `model` of every device (`rollout --model`)."""
    blobs = bundle_blobs(bundle)
    rid = new_rollout_id(blobs.manifest.bundle_id)
    # a dry run shows what each device would do now; a real run reads each device's facts right
    # before acting on it (push does), so it does not ask every device twice
    state = plan_rollout(
        rid,
        str(bundle.resolve()),
        blobs.manifest.release_name,
        names,
        gather_facts(inv, names, net, model) if dry_run else {},
        canary=waves.canary,
        wave=waves.wave,
        max_fail=waves.max_fail,
        concurrency=concurrency,
    )
    state.options = {"health": asdict(health), "net": asdict(net), "model": model}
    if dry_run:
        return state
    return RolloutRunner(inv, state, blobs, rollouts_dir() / f"{rid}.json", health, net, listener, model).run()


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
    blobs = bundle_blobs(Path(state.bundle))
    if blobs.manifest.release_name != state.release:
        raise InputError(f"{state.bundle} changed since the rollout started ({state.release})")
    health = HealthPolicy(**state.options.get("health", {}))
    net = Network(**state.options.get("net", {}))
    model = state.options.get("model", DEFAULT_SLOT)  # (a rollout recorded before model slots: the default)
    return RolloutRunner(inv, prepare_resume(state), blobs, path, health, net, listener, model).run()


def _secs(t0: float) -> float:
    return round(time.monotonic() - t0, 3)
