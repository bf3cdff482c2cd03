"""The controller's side of MQTT: fleet settings, signed desired-state documents, retained statuses.

CONFIG/fleet.toml (written by hand or by the pilot set-up, docs/fleet.md):

    [mqtt]
    broker = "broker.example:8883"
    username = "controller"             # the only broker user that may write desired state
    password_file = "/etc/edgedeploy/mqtt-controller"
    ca_file = "/etc/edgedeploy/fleet-ca.crt"   # optional: TLS, checked against the fleet CA
    [rollout]
    key = "rollout-2026"                # signing key (CONFIG/keys/<key>.key) devices pin as rollout key
    expires_hours = 24
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgedeploy_agent.bundle import canonical_json
from edgedeploy_agent.desired import (
    TOPIC_ROOT,
    DesiredDoc,
    DesiredHealth,
    MessageError,
    parse_message,
    parse_status,
    split_slot_key,
)
from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import ConnectionFailed, InputError, validation_text
from ..paths import config_dir
from ..signing import sign_document

log = logging.getLogger(__name__)


class MqttSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    broker: str
    username: str = "controller"
    password_file: str | None = None
    ca_file: str | None = None


class RolloutSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str
    expires_hours: float = Field(default=24.0, gt=0)


class FleetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mqtt: MqttSettings
    rollout: RolloutSettings | None = None


def fleet_config_path() -> Path:
    return config_dir() / "fleet.toml"


def fleet_toml(config: FleetConfig) -> str:
    """Pure: `config` as CONFIG/fleet.toml holds it (what `fleet-servers init` and the tests' pull fleet write)."""
    import tomli_w

    return tomli_w.dumps(config.model_dump(exclude_none=True))


def load_fleet_config(path: Path | None = None) -> FleetConfig:
    path = path or fleet_config_path()
    try:
        return FleetConfig.model_validate(tomllib.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InputError(
            f"{path} does not exist: --via mqtt needs the broker and the rollout key",
            hint="see docs/fleet.md, 'Pull rollouts'",
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"{path} is not valid TOML: {e}") from None
    except ValidationError as e:
        raise InputError(f"{path}: {validation_text(e)}") from None


def desired_payload(
    key: str, device: str, ref: str, release: str, rollout: str, wave: int, serial: int, *,
    health: DesiredHealth, jitter_s: float = 0.0, expires_hours: float = 24.0,
    action: Literal["deploy", "rollback"] = "deploy", model: str = DEFAULT_SLOT,
) -> bytes:  # fmt: skip
    """A signed desired-state message for one device (about its model slot `model`)."""
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    doc = DesiredDoc(
        device=device, action=action, ref=ref, release=release, rollout=rollout, wave=wave, serial=serial,
        issued=now, expires=now + dt.timedelta(hours=expires_hours), jitter_s=jitter_s, health=health, model=model,
    )  # fmt: skip
    data = doc.wire()
    return canonical_json({"doc": data, "sig": sign_document(canonical_json(data), key)})


UNREADABLE = "unreadable"  # the state the controller gives a device whose status message it cannot read


def read_status(device: str, payload: bytes, model: str = DEFAULT_SLOT) -> dict[str, Any]:
    """Pure: one status message (from the topic of `device`'s model slot `model`) -> the validated status as a
    dict (StatusDoc's fields that are set), or {"state": "unreadable", ...} with the reason. Never raises on
    what a device can send."""
    try:
        return parse_status(payload, device, model).model_dump(exclude_none=True)
    except MessageError as e:
        return {"device": device, "state": UNREADABLE, "code": UNREADABLE, "message": str(e)[:300]}


def last_status(st: dict[str, Any], serial: int) -> str:
    """Pure: a device's last status for a wait on document `serial` that ended without an outcome: its state,
    and the device's own reason (code: message) when it gave one for that document; e.g. a registry it cannot
    reach, which the watch retries with its status saying why until the controller gives up."""
    if not st:
        return "no status"
    said = f"last status {st.get('state')}"
    if st.get("serial") == serial and st.get("code"):
        said += "; it reports " + ": ".join(str(x) for x in (st["code"], st.get("message")) if x)
    return said


def desired_serial(payload: bytes) -> int | None:
    """Pure: the serial of a retained desired document (written by a controller), None if unreadable."""
    try:
        return DesiredDoc.model_validate(parse_message(payload).get("doc")).serial
    except (MessageError, ValidationError):
        return None


class Controller:
    """One MQTT session as the controller: reads every retained status (and the retained desired documents,
    for their serials), publishes desired state. Every message is bounded and validated before use: a
    device whose status cannot be read is `unreadable`, and the session goes on for the others.

    Statuses, serials and desired state are per model slot, keyed by slot_key: the device's name for its
    `default` slot, DEVICE/SLOT for another (each slot has its own topics, desired.py)."""

    def __init__(self, settings: MqttSettings, client_id: str | None = None) -> None:
        import paho.mqtt.client as mqtt

        # one id per session: a second controller (`status --via mqtt` during a rollout) must not take over
        # the first one's session; clean sessions, so these ids leave nothing behind on the broker
        client_id = client_id or f"edgedeploy-controller-{os.getpid()}-{secrets.token_hex(3)}"

        self.settings = settings
        self.statuses: dict[str, dict[str, Any]] = {}
        self.desired_serials: dict[str, int] = {}  # the serial of each slot's retained desired document
        self._lock = threading.Lock()
        self.changed = threading.Condition(self._lock)  # any status changed
        self._device_changed: dict[str, threading.Condition] = {}  # one device's: a waiter wakes for its own only
        self._connected = threading.Event()
        self._refused: str | None = None
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,  # type: ignore[attr-defined]
            client_id=client_id,
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        password = None
        if settings.password_file:
            try:
                password = Path(settings.password_file).read_text(encoding="utf-8").strip()
            except OSError as e:
                raise InputError(f"cannot read the broker password file {settings.password_file}: {e}") from None
        self.client.username_pw_set(settings.username, password)
        if settings.ca_file:
            self.client.tls_set(ca_certs=settings.ca_file)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_disconnect = lambda c, u, f, rc, p: self._connected.clear()
        self.client.reconnect_delay_set(1, 10)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            self._refused = str(reason)
            return
        # desired first: the broker sends retained messages in this order, so a device's desired serial is
        # known by the time its status arrives (next_serial)
        client.subscribe(
            [(f"{TOPIC_ROOT}/{kind}/{levels}", 1) for kind in ("desired", "status") for levels in ("+", "+/+")]
        )
        self._connected.set()

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        try:
            self._take(str(msg.topic), bytes(msg.payload))
        except Exception:  # the network thread serves every device: one message must never end it
            log.exception("MQTT message on %s not taken", str(msg.topic)[:200])

    def _take(self, topic: str, payload: bytes) -> None:
        kind, _, key = topic[len(TOPIC_ROOT) + 1 :].partition("/")
        named = split_slot_key(key)
        if named is None:
            return  # not a topic of a device (slot) this controller can name (the broker's ACL admits no other)
        if kind == "desired":
            serial = desired_serial(payload) if payload else None
            if serial is not None:
                with self._lock:
                    self.desired_serials[key] = max(serial, self.desired_serials.get(key, 0))
            return
        if kind != "status":
            return
        with self._lock:
            if payload:
                self.statuses[key] = read_status(named[0], payload, named[1])
            else:  # a cleared retained status: no status
                self.statuses.pop(key, None)
            self.changed.notify_all()
            if key in self._device_changed:
                self._device_changed[key].notify_all()

    def next_serial(self, key: str) -> int:
        """The serial of the next desired document for a device's slot (`key`, slot_key): one more than the
        highest of what the device says it acted on for that slot (`floor`), its last status's document and
        the broker's retained desired document for it, and than any this controller gave it. Per slot and
        from what the fleet holds, never from this host's clock (docs/fleet.md, "Serials of desired state")."""
        with self._lock:
            st = self.statuses.get(key, {})
            seen = [self.desired_serials.get(key, 0), st.get("floor") or 0, st.get("serial") or 0]
            serial = max(seen) + 1
            self.desired_serials[key] = serial  # taken: a second document for it goes higher
            return serial

    def __enter__(self) -> Controller:
        host, _, port = self.settings.broker.rpartition(":")
        try:
            self.client.connect(host, int(port), keepalive=30)
        except (OSError, ValueError) as e:
            self._close_sockets()
            raise ConnectionFailed(f"cannot reach the MQTT broker {self.settings.broker}: {e}") from None
        self.client.loop_start()
        if not self._connected.wait(10):
            self.client.loop_stop()
            self._close_sockets()
            why = f"it refused the login ({self._refused})" if self._refused else "no answer in 10 s"
            raise ConnectionFailed(f"MQTT broker {self.settings.broker}: {why}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        self._close_sockets()

    def _close_sockets(self) -> None:
        # paho keeps a wake-up socket pair (and, after a failed handshake, the socket) open until garbage
        # collection; it has no public close, so its own reset is called
        reset = getattr(self.client, "_reset_sockets", None)
        if reset is not None:
            reset()

    def read_statuses(self, names: list[str], settle: float = 1.0) -> dict[str, dict[str, Any]]:
        """Retained statuses of these devices (or slots, by slot_key): waits until all arrived, or `settle` s
        without news."""
        end = time.monotonic() + settle
        with self.changed:
            while not all(n in self.statuses for n in names):
                left = end - time.monotonic()
                if left <= 0 or not self.changed.wait(left):
                    break
            return {n: self.statuses[n] for n in names if n in self.statuses}

    def publish_desired(self, key: str, payload: bytes, timeout: float = 30.0) -> None:
        """On the desired topic of a device's slot (`key`, slot_key), retained, QoS 1; returns once the broker
        acknowledged it (survives a broker restart)."""
        end = time.monotonic() + timeout
        while True:
            info = self.client.publish(f"{TOPIC_ROOT}/desired/{key}", payload, qos=1, retain=True)
            try:
                info.wait_for_publish(max(0.1, end - time.monotonic()))
                if info.is_published():
                    return
            except RuntimeError:  # not connected right now: paho reconnects in its thread
                pass
            if time.monotonic() >= end:
                raise ConnectionFailed(f"MQTT broker {self.settings.broker} did not take the desired state of {key}")
            time.sleep(0.2)

    def wait_status(self, key: str, done: Any, timeout: float, cancelled: Any = lambda: False) -> dict[str, Any]:
        """Wait until done(status) is true for this device (slot, by slot_key); returns the last status (maybe
        not done)."""
        end = time.monotonic() + timeout
        with self._lock:
            cond = self._device_changed.setdefault(key, threading.Condition(self._lock))
            while True:
                st = self.statuses.get(key, {})
                if done(st) or cancelled():
                    return st
                left = end - time.monotonic()
                if left <= 0:
                    return st
                cond.wait(min(left, 0.5))
