"""The façade for pull rollouts (the CLI calls it like api.py): publish, rollout/status/rollback via MQTT.

Bytes go through an OCI registry (publish.py), intent and status through an MQTT broker
(remote/mqtt.py); planning and halt rules are the SSH rollout's (remote/rollout.py, rollout_runner.py).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edgedeploy_agent.desired import TERMINAL, DesiredHealth

from .errors import InputError
from .inventory import Inventory
from .publish import published_ref
from .remote.blobs import bundle_blobs
from .remote.install_pull import PullOptions
from .remote.mqtt import Controller, FleetConfig, desired_payload, load_fleet_config
from .remote.mqtt_rollout import MqttRolloutRunner, PullPolicy, status_facts
from .remote.plan import HealthPolicy
from .remote.rollout import DEFAULT_WAVES, RolloutState, Waves, new_rollout_id, plan_rollout
from .remote.rollout_runner import Listener, prepare_resume, rollouts_dir
from .signing import list_keys, next_serial


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
) -> RolloutState:
    """Plan from retained statuses; unless dry_run, publish desired state wave by wave."""
    cfg = load_fleet_config(config)
    key = _rollout_key(cfg)
    blobs = bundle_blobs(bundle)
    ref = published_ref(blobs)
    rid = new_rollout_id(blobs.manifest.bundle_id)
    with Controller(cfg.mqtt) as controller:
        statuses = controller.read_statuses(names)
        facts = {n: status_facts(statuses.get(n)) for n in names}
        state = plan_rollout(
            rid, str(bundle.resolve()), blobs.manifest.release_name, names, facts,
            canary=waves.canary, wave=waves.wave, max_fail=waves.max_fail, concurrency=max(1, len(names)),
        )  # fmt: skip
        pull = PullPolicy(ref, key, 0, rate, jitter_s, pull_timeout, cfg.rollout.expires_hours if cfg.rollout else 24)
        state.options = {
            "via": "mqtt",
            "health": asdict(health or HealthPolicy()),
            "pull": asdict(pull),
            # what each device ran before, by ref: what a fleet rollback publishes
            "previous_refs": {n: st.get("ref") for n, st in statuses.items() if st.get("ref") != ref},
        }
        if dry_run:
            return state
        return _run(inv, state, rollouts_dir() / f"{rid}.json", controller, listener)


def _run(inv: Inventory, state: RolloutState, path: Path, controller: Controller, listener: Listener) -> RolloutState:
    pull = PullPolicy(**{**state.options["pull"], "serial": next_serial()})
    health = HealthPolicy(**state.options["health"])
    blobs = bundle_blobs(Path(state.bundle))
    return MqttRolloutRunner(inv, state, blobs, path, health, controller, pull, listener).run()


def resume_via_mqtt(
    inv: Inventory, state: RolloutState, path: Path, listener: Listener = lambda d, s, m: None
) -> RolloutState:
    """Publish again (with a new serial) to every device that did not end ok; same halt rules."""
    cfg = load_fleet_config()
    with Controller(cfg.mqtt) as controller:
        return _run(inv, prepare_resume(state), path, controller, listener)


def fleet_status_via_mqtt(names: list[str], settle: float = 2.0) -> dict[str, dict[str, Any] | None]:
    """Each device's retained status (None: it never reported)."""
    cfg = load_fleet_config()
    with Controller(cfg.mqtt) as controller:
        got = controller.read_statuses(names, settle)
    return {n: got.get(n) for n in names}


def rollback_via_mqtt(names: list[str], timeout: float = 300.0) -> dict[str, dict[str, Any]]:
    """Publish each device's previous ref (from the newest MQTT rollout) and wait for its outcome."""
    cfg = load_fleet_config()
    key = _rollout_key(cfg)
    files = sorted(rollouts_dir().glob("*.json")) if rollouts_dir().is_dir() else []
    recorded = [json.loads(p.read_text()) for p in files]
    mqtt_rollouts = [r for r in recorded if (r.get("options") or {}).get("via") == "mqtt"]
    if not mqtt_rollouts:
        raise InputError("no rollout via mqtt is recorded on this host: nothing to roll back to")
    last = mqtt_rollouts[-1]
    previous: dict[str, str | None] = last["options"].get("previous_refs", {})
    serial = next_serial()
    results: dict[str, dict[str, Any]] = {}
    with Controller(cfg.mqtt) as controller:
        for n in names:
            ref = previous.get(n)
            if not ref:
                results[n] = {"state": "skipped", "message": f"no previous ref recorded for {n} in {last['id']}"}
                continue
            payload = desired_payload(
                key, n, ref, "", f"rollback-{last['id']}", 0, serial, health=DesiredHealth(),
            )  # fmt: skip
            controller.publish_desired(n, payload)
        for n in names:
            if n in results:
                continue
            st = controller.wait_status(n, lambda s: s.get("serial") == serial and s.get("state") in TERMINAL, timeout)
            results[n] = (
                st if st.get("serial") == serial else {"state": "timeout", "message": f"no outcome in {timeout} s"}
            )
    return results


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
