"""The façade for pull rollouts (the CLI calls it like api.py): publish, rollout/status/rollback via MQTT.

Bytes go through an OCI registry (publish.py), intent and status through an MQTT broker
(remote/mqtt.py); planning and halt rules are the SSH rollout's (remote/rollout.py, rollout_runner.py).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from edgedeploy_agent.desired import TERMINAL, DesiredHealth, slot_key
from edgedeploy_agent.names import DEFAULT_SLOT

from .errors import DeviceError, EdgeDeployError, InputError
from .inventory import Inventory
from .publish import published_ref
from .remote.blobs import bundle_blobs
from .remote.fleet import FleetResult, run_fleet
from .remote.install_pull import PullOptions
from .remote.mqtt import Controller, FleetConfig, desired_payload, last_status, load_fleet_config
from .remote.mqtt_rollout import MqttRolloutRunner, PullPolicy, read_slot_statuses, slot_release, status_facts
from .remote.plan import HealthPolicy
from .remote.rollout import DEFAULT_WAVES, RolloutState, Waves, new_rollout_id, plan_rollout
from .remote.rollout_runner import Listener, device_log, prepare_resume, rollouts_dir
from .signing import list_keys


def _rollout_key(cfg: FleetConfig) -> str:
    if cfg.rollout is None:
        raise InputError("fleet.toml has no [rollout] key: desired state must be signed", hint="see docs/fleet.md")
    return cfg.rollout.key


def rollout_via_mqtt(
    inv: Inventory,
    bundle: Path,
    names: list[str],
    waves: Waves = DEFAULT_WAVES,
    *,
    health: HealthPolicy | None = None,
    rate: float = 50.0,
    jitter_s: float = 0.0,
    pull_timeout: float = 300.0,
    dry_run: bool = False,
    listener: Listener = lambda d, s, m: None,
    config: Path | None = None,
    model: str = DEFAULT_SLOT,
) -> RolloutState:
    """Plan from retained statuses; unless dry_run, publish desired state wave by wave (about model slot
    `model` of each device)."""
    cfg = load_fleet_config(config)
    key = _rollout_key(cfg)
    blobs = bundle_blobs(bundle)
    ref = published_ref(blobs)
    rid = new_rollout_id(blobs.manifest.bundle_id)
    with Controller(cfg.mqtt) as controller:
        statuses = read_slot_statuses(controller, names, model)
        facts = {n: status_facts(statuses[n], model) for n in names}
        state = plan_rollout(
            rid, str(bundle.resolve()), blobs.manifest.release_name, names, facts,
            canary=waves.canary, wave=waves.wave, max_fail=waves.max_fail, concurrency=max(1, len(names)),
        )  # fmt: skip
        expires = cfg.rollout.expires_hours if cfg.rollout else 24
        pull = PullPolicy(ref, key, rate, jitter_s, pull_timeout, expires, model)
        state.options = {
            "via": "mqtt",
            "health": asdict(health or HealthPolicy()),
            "pull": asdict(pull),
            # what each device ran when the rollout started (its committed release; the last will of a
            # device offline then says it too): what `rollback --via mqtt` goes back to
            "before": releases_before(names, statuses, model),
        }
        if dry_run:
            return state
        return _run(inv, state, rollouts_dir() / f"{rid}.json", controller, listener)


def releases_before(
    names: list[str], statuses: dict[str, dict[str, Any] | None], model: str = DEFAULT_SLOT
) -> dict[str, str | None]:
    """Pure: the release each device runs in model slot `model` by its retained status (slot_status; None: no
    status, or an unreadable one, which read_status gives no release)."""
    return {n: slot_release(statuses.get(n), model) for n in names}


def _run(inv: Inventory, state: RolloutState, path: Path, controller: Controller, listener: Listener) -> RolloutState:
    known = {f.name for f in fields(PullPolicy)}  # a rollout recorded before serials were per device has one
    pull = PullPolicy(**{k: v for k, v in state.options["pull"].items() if k in known})
    health = HealthPolicy(**state.options["health"])
    blobs = bundle_blobs(Path(state.bundle))
    return MqttRolloutRunner(inv, state, blobs, path, health, controller, pull, listener).run()


def resume_via_mqtt(
    inv: Inventory, state: RolloutState, path: Path, listener: Listener = lambda d, s, m: None
) -> RolloutState:
    """Publish again (with a new serial) to every device that did not end ok; same halt rules."""
    cfg = load_fleet_config()
    with Controller(cfg.mqtt) as controller:
        # every device's retained status before the first next_serial: a serial above the floor it reports
        pull = state.options.get("pull") or {}
        read_slot_statuses(controller, list(state.devices), pull.get("model", DEFAULT_SLOT))
        return _run(inv, prepare_resume(state), path, controller, listener)


def fleet_status_via_mqtt(
    names: list[str], settle: float = 2.0, model: str = DEFAULT_SLOT
) -> dict[str, dict[str, Any] | None]:
    """Each device's retained status about model slot `model` (slot_status; None: it never reported)."""
    cfg = load_fleet_config()
    with Controller(cfg.mqtt) as controller:
        return read_slot_statuses(controller, names, model, settle)


def rollback_via_mqtt(
    names: list[str], health_timeout: float = 60.0, margin: float = 30.0, model: str = DEFAULT_SLOT
) -> FleetResult[dict[str, Any]]:
    """Send each device back to the release it ran when the newest MQTT rollout to model slot `model` started
    (in that slot), its health check
    `health_timeout` s, and wait for the outcomes: all published first, then one deadline (the health check
    plus `margin` s for the broker's round trips) shared by every device. Per-device results as the SSH fan-out
    gives them: {"outcome", "release", "previous"} or the device's error."""
    timeout = health_timeout + margin
    cfg = load_fleet_config()
    key = _rollout_key(cfg)
    files = sorted(rollouts_dir().glob("*.json")) if rollouts_dir().is_dir() else []
    recorded = [json.loads(p.read_text()) for p in files]
    mqtt_rollouts = [
        r
        for r in recorded
        if (r.get("options") or {}).get("via") == "mqtt"
        and (r["options"].get("pull") or {}).get("model", DEFAULT_SLOT) == model
    ]
    if not mqtt_rollouts:
        of = "" if model == DEFAULT_SLOT else f" of model {model}"
        raise InputError(f"no rollout{of} via mqtt is recorded on this host: nothing to roll back to")
    last = mqtt_rollouts[-1]
    rid = last["id"]
    if "before" not in last["options"]:
        raise InputError(
            f"rollout {rid} does not record what its devices ran before it (an older edgedeploy recorded it)",
            hint="roll back over SSH: edgedeploy rollback --group TAG",
        )
    before: dict[str, str | None] = last["options"]["before"]
    refused: dict[str, EdgeDeployError] = {}
    serials: dict[str, int] = {}
    was: dict[str, str | None] = {}
    cancelled = threading.Event()
    with Controller(cfg.mqtt) as controller:
        statuses = read_slot_statuses(controller, names, model)
        for n in names:
            target = before.get(n)
            if not target:
                why = "was not in it" if n not in before else "named no release (no status)"
                refused[n] = DeviceError(
                    f"nothing to roll back to: {n} {why} when rollout {rid} started", code="no-previous"
                )
                continue
            was[n] = slot_release(statuses[n], model)
            serials[n] = controller.next_serial(slot_key(n, model))
            payload = desired_payload(
                key, n, "", target, f"rollback-{rid}", 0, serials[n], health=DesiredHealth(timeout_s=health_timeout),
                expires_hours=cfg.rollout.expires_hours if cfg.rollout else 24, action="rollback", model=model,
            )  # fmt: skip
            try:
                controller.publish_desired(slot_key(n, model), payload)
            except EdgeDeployError as e:
                refused[n] = e
        deadline = time.monotonic() + timeout

        def one(n: str) -> dict[str, Any]:
            if n in refused:
                raise refused[n]

            def done(st: dict[str, Any]) -> bool:
                return st.get("serial") == serials[n] and st.get("state") in TERMINAL

            st = controller.wait_status(
                slot_key(n, model), done, deadline - time.monotonic(), cancelled=cancelled.is_set
            )
            if not done(st):
                seen = last_status(st, serials[n])
                raise DeviceError(f"no outcome from {n} within {timeout:.0f} s ({seen})", code="timeout")
            if st["state"] != "committed":
                raise DeviceError(
                    f"{st['state']}: {st.get('message') or st.get('code')}", code=str(st.get("code") or st["state"])
                )
            return {"outcome": st.get("outcome") or "rolled-back", "release": st.get("release"), "previous": was[n]}

        fleet = run_fleet(names, one, name=str, on_interrupt=cancelled.set)
    for n, r in fleet.succeeded.items():
        device_log(n, f"rollback via mqtt ({rid}) {r['outcome']}: {r['release']} (was {r['previous']})")
    for n, err in fleet.failed.items():
        device_log(n, f"rollback via mqtt ({rid}) failed: {err.message}")
    return fleet


def pull_install_options(
    broker: str | None,
    registry: str | None,
    rollout_key: str | None,
    ca_file: Path | None,
    broker_passwd: Path | None,
) -> PullOptions | None:
    """`agent install --mqtt ...`: the rollout key's public half (named, or fleet.toml's), or None without --mqtt."""
    if broker is None:
        if registry or rollout_key or ca_file or broker_passwd:
            raise InputError("--registry, --rollout-key, --mqtt-ca and --broker-passwd go with --mqtt BROKER")
        return None
    if registry is None:
        raise InputError("--mqtt needs --registry URL: the device's read-only registry endpoint")
    name = rollout_key or _rollout_key(load_fleet_config())
    keys = {k.name: k.public for k in list_keys()}
    if name not in keys:
        raise InputError(f"no signing key named {name!r}", hint=f"edgedeploy keys generate {name}")
    if ca_file is not None and not ca_file.is_file():
        raise InputError(f"fleet CA {ca_file} does not exist")
    return PullOptions(broker, registry, keys[name], ca_file, broker_passwd)
