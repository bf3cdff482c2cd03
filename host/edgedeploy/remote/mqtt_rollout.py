"""Rollouts as desired state over MQTT: the same planner, waves and halt rules as SSH, other delivery.

Facts come from the devices' retained statuses instead of SSH. Delivering to a device is publishing
its signed desired state (retained, QoS 1) at no more than `rate` per second, then waiting for its
status to say the outcome for that document's serial (a refusal names the serial too, and ends the
wait at once); no outcome within the device timeout counts as a failure (the device keeps whatever it
runs). Each document's serial is the device's own next one (Controller.next_serial).

A rollout to a model slot besides `default` publishes on that slot's desired topic and waits on its status
topic (desired.py); the device's own status says whether it is offline, and every slot's release.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgedeploy_agent.desired import TERMINAL, DesiredHealth, slot_key
from edgedeploy_agent.names import DEFAULT_SLOT

from ..errors import DeviceError
from ..inventory import Inventory
from .blobs import BundleBlobs
from .facts import DeviceFacts
from .mqtt import UNREADABLE, Controller, desired_payload, last_status
from .plan import HealthPolicy
from .rollout import RolloutState
from .rollout_runner import Listener, RolloutRunner

# a device's status states -> the rollout's outcome for it
OUTCOME = {"committed": "committed", "rolled-back": "failed", "refused": "failed"}


def slot_release(st: dict[str, Any] | None, model: str = DEFAULT_SLOT) -> str | None:
    """Pure: the release a retained status says model slot `model` runs (None: no status, or none there)."""
    st = st or {}
    if (st.get("model") or DEFAULT_SLOT) == model:
        return st.get("release")
    return (st.get("models") or {}).get(model)


def slot_status(statuses: dict[str, dict[str, Any]], device: str, model: str = DEFAULT_SLOT) -> dict[str, Any] | None:
    """Pure: what the retained statuses (by slot_key) say about model slot `model` of `device`: the slot's own
    status, said offline when the device's is (its last will is on the device's topic only), or unreadable
    when that is; without a status of its own (never addressed over MQTT), the device's, which names every
    slot's release."""
    device_st, own = statuses.get(device), statuses.get(slot_key(device, model))
    if model == DEFAULT_SLOT or own is None:
        return device_st
    if device_st and device_st.get("state") == UNREADABLE:
        return device_st
    if device_st and device_st.get("state") == "offline":
        return {**own, "state": "offline"}
    return own


def read_slot_statuses(controller: Controller, names: list[str], model: str, settle: float = 1.0) -> dict[str, Any]:
    """Each device's slot_status of `model` (None: no status); the slots' own statuses too, for their serials."""
    keys = [*names, *(slot_key(n, model) for n in names if model != DEFAULT_SLOT)]
    statuses = controller.read_statuses(keys, settle)
    return {n: slot_status(statuses, n, model) for n in names}


def status_facts(st: dict[str, Any] | None, model: str = DEFAULT_SLOT) -> DeviceFacts | str:
    """Pure: a retained status -> the facts the planner reads about model slot `model` (or why there are none).
    A device with several slots says every slot's release (`models`); its status is about one (`model`)."""
    if not st:
        return "no status on the broker (never connected)"
    if st.get("state") == UNREADABLE:
        return f"status unreadable ({st.get('message')})"
    release = slot_release(st, model)
    about_it = (st.get("model") or DEFAULT_SLOT) == model
    healthy = release if about_it and st.get("state") in ("committed", "idle") else None
    return DeviceFacts(
        agent_version="?", bundle_schema=0, arch="?", python="?", initialised=True, free_bytes=None,
        current_release=release, current_bundle_id=None, running=st.get("state") != "offline",
        healthy_release=healthy, health_state=st.get("state"), previous=(), pending_state=None,
    )  # fmt: skip


@dataclass(frozen=True)
class PullPolicy:
    ref: str
    key: str
    rate: float = 50.0  # desired-state publishes per second
    jitter_s: float = 0.0
    pull_timeout: float = 300.0  # download allowance before the health timeout starts to count
    expires_hours: float = 24.0
    model: str = DEFAULT_SLOT  # the model slot the rollout delivers to (`rollout --via mqtt --model`)


class RateLimit:
    """At most `rate` calls of wait() per second, across threads."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next = time.monotonic()
        self.lock = threading.Lock()

    def wait(self) -> None:
        with self.lock:
            now = time.monotonic()
            at = max(now, self.next)
            self.next = at + self.interval
        if at > now:
            time.sleep(at - now)


class MqttRolloutRunner(RolloutRunner):
    # thousands of devices change state within seconds: rewrite the state file at most once a second (a
    # crash loses at most that second; `--resume` publishes again, and a device that already did it says so)
    save_interval = 1.0

    def __init__(
        self,
        inv: Inventory,
        state: RolloutState,
        blobs: BundleBlobs,
        path: Path,
        health: HealthPolicy,
        controller: Controller,
        pull: PullPolicy,
        listener: Listener = lambda d, s, m: None,
    ) -> None:
        super().__init__(inv, state, blobs, path, health, listener=listener)
        self.controller, self.pull = controller, pull
        self.rate = RateLimit(pull.rate)

    def _deliver(self, name: str) -> tuple[str, str, str | None]:
        wave = self.state.devices[name].wave
        h = self.health
        key = slot_key(name, self.pull.model)
        serial = self.controller.next_serial(key)
        payload = desired_payload(
            self.pull.key, name, self.pull.ref, self.state.release, self.state.id, wave, serial,
            health=DesiredHealth(
                timeout_s=h.timeout, min_inferences=h.min_inferences, max_p95_ms=h.max_p95_ms, min_fps=h.min_fps
            ),
            jitter_s=self.pull.jitter_s, expires_hours=self.pull.expires_hours, model=self.pull.model,
        )  # fmt: skip
        self.rate.wait()
        self.controller.publish_desired(key, payload)
        self._step(name, f"desired state published (serial {serial})")
        timeout = self.pull.jitter_s + self.pull.pull_timeout + h.timeout

        def done(st: dict[str, Any]) -> bool:
            return st.get("serial") == serial and st.get("state") in TERMINAL

        st = self.controller.wait_status(key, done, timeout, cancelled=lambda: self._halt == "interrupted")
        if not done(st):
            seen = last_status(st, serial)
            if self._halt == "interrupted":
                raise DeviceError(f"interrupted before {name} reported ({seen})", code="interrupted")
            raise DeviceError(f"no outcome from {name} within {timeout:.0f} s ({seen})", code="timeout")
        outcome = OUTCOME[st["state"]]
        if outcome == "failed":
            raise DeviceError(
                f"{st['state']}: {st.get('message') or st.get('code')}", code=str(st.get("code") or st["state"])
            )
        if st.get("outcome") == "unchanged":
            outcome = "unchanged"
        return (
            outcome,
            f"{outcome} {st.get('release')} (pulled {self.pull.ref.rsplit('@', 1)[-1][:19]})",
            st.get("release"),
        )

    def _release_after_failure(self, name: str) -> str | None:
        release = self.controller.statuses.get(slot_key(name, self.pull.model), {}).get("release")
        return str(release) if release else None
