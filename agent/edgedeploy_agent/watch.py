"""`edgedeploy-agent watch`: follow this device's desired state over MQTT, pull by digest, deploy, report.

One network thread keeps the MQTT session (client id = device name; jittered exponential backoff, so a
fleet reconnecting after a broker restart does not arrive all at once) and hands desired-state
messages to the main thread, which verifies them (desired.py), downloads what the blob store lacks
(oci.py) and hands over to the existing deploy path (Deployment + BlobSource, under the device lock).
Every step is reported on the device's retained status topic; the broker's last will says "offline".

Each model slot has its own desired topic and status topic (desired.py), serial floor and last document;
the main thread acts on one document at a time (a newer one for any slot pre-empts a download, which is
resumed once the newer one is done).

If the broker is away the device keeps its release and, every `poll_s`, tries again the last desired
document it accepted and has not finished (its registry may still be reachable).

ROOT/watch.json        broker, read-only registry endpoint, credentials file, TLS CA (watch-config writes it)
ROOT/watch/state.json  the serial floor and the last accepted document (of `default`), so a restart resumes
ROOT/watch/models/<slot>.json  the same for another model slot
"""

import errno
import json
import logging
import random
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

from pydantic import BaseModel, ConfigDict, Field

from .blobs import BlobSource, BlobStore
from .desired import (
    TERMINAL,
    DesiredDoc,
    DesiredRefused,
    desired_topic,
    rollout_trust,
    status_doc,
    status_topic,
    verify_desired,
)
from .durable import write_atomic
from .errors import AgentError, HealthCheckFailed, StateError
from .lifecycle import Deployment, rollback, watch_for_interruptions
from .names import DEFAULT_SLOT, is_slot_name
from .oci import DigestMismatch, OciPuller, Pulled, PullError, Ref, parse_ref
from .service import HealthObjectives, make_service
from .store import DeviceStore

log = logging.getLogger("edgedeploy_agent.watch")


class ReleaseNotKept(StateError):
    """A fleet rollback names a release this device neither runs nor kept as the one before."""

    code = "release-not-kept"


class WatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    broker: str = Field(pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$")  # HOST:PORT
    registry_url: str  # the device's read-only endpoint, e.g. http://cache.site:5000
    username: Optional[str] = None  # default: the device name
    password_file: Optional[str] = None
    ca_file: Optional[str] = None  # TLS to the broker, checked against this fleet CA
    keepalive_s: int = Field(default=30, ge=5)
    backoff_min_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=60.0, gt=0)
    poll_s: float = Field(default=300.0, gt=0)
    max_digest_failures: int = Field(default=3, ge=1)

    @classmethod
    def path(cls, root: Path) -> Path:
        return root / "watch.json"

    @classmethod
    def load(cls, root: Path) -> "WatchConfig":
        try:
            return cls.model_validate_json(cls.path(root).read_bytes())
        except FileNotFoundError:
            raise StateError(
                f"{cls.path(root)} does not exist", hint="run `edgedeploy-agent watch-config --broker ...`"
            ) from None
        except ValueError as e:
            raise StateError(f"{cls.path(root)} is invalid: {str(e).splitlines()[0]}") from None


def backoff_delay(attempt: int, low: float, high: float, rng: random.Random) -> float:
    """Exponential backoff with equal jitter: half the ceiling fixed, half random."""
    ceiling = min(high, low * (2 ** min(attempt, 30)))
    return float(ceiling / 2 + rng.uniform(0, ceiling / 2))


class Watcher:
    def __init__(self, store: DeviceStore, cfg: WatchConfig) -> None:
        self.store, self.cfg = store, cfg
        self.device = store.config().device_name
        self.rng = random.Random()
        self.stop = threading.Event()
        self.wake = threading.Event()
        self.connected = threading.Event()
        self._lock = threading.Lock()
        self._inbox: dict[str, bytes] = {}  # the newest desired message of each slot not yet taken
        self._unsaved: dict[str, dict[str, Any]] = {}  # per slot: the state a full disk kept off its file
        # per slot: the serial floor every status says (the controller's serials), the last status (sent again
        # on every connect) and its state and fields (the device's status is sent again when another slot's
        # release changes: it names every slot's release)
        self._floors: dict[str, Optional[int]] = {}
        self._last_status: dict[str, bytes] = {}
        self._last_fields: dict[str, tuple[str, dict[str, Any]]] = {}
        self.client: Any = None
        for slot in self._known_slots():
            self._floors[slot] = self._load(slot).get("serial")
            self._publish(slot, "idle")
        self._ever_connected = False  # a connection's log line says "reconnected" after the first

    # --- persisted state ------------------------------------------------------------------------
    def _known_slots(self) -> list[str]:
        try:
            return self.store.slots()
        except AgentError:
            return [DEFAULT_SLOT]

    def state_path(self, slot: str) -> Path:
        """The watch state of model slot `slot` (`default` keeps the file it had before slots)."""
        folder = self.store.root / "watch"
        return folder / "state.json" if slot == DEFAULT_SLOT else folder / "models" / f"{slot}.json"

    def _load(self, slot: str) -> dict[str, Any]:
        if slot in self._unsaved:
            return dict(self._unsaved[slot])
        try:
            data = json.loads(self.state_path(slot).read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            data = None
        if not isinstance(data, dict):
            return {"serial": None, "last": None, "done": None}
        return data

    def _save(self, slot: str, data: dict[str, Any]) -> None:
        """state.json, durably; on a full disk the state is kept in memory (the floor holds for this process;
        a restart rereads the old file, whose floor is lower or equal, never higher) and the watch goes on:
        crashing here would crash-loop on every restart until someone freed space by hand."""
        self._floors[slot] = data.get("serial")
        path = self.state_path(slot)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, json.dumps(data))
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            log.warning("cannot write %s (%s): kept in memory until the disk has room", path, e)
            self._unsaved[slot] = dict(data)
        else:
            self._unsaved.pop(slot, None)

    def _release(self, slot: str) -> Optional[str]:
        try:
            current: Optional[str] = self.store.for_slot(slot).state()["current"]
            return current
        except AgentError:
            return None

    def _slots(self, slot: str) -> dict[str, Any]:
        """On a device with several model slots: the slot the status is about, and every slot's release."""
        try:
            slots = self.store.slots()
            if len(slots) == 1:
                return {}
            return {
                "model": slot,
                "models": {s: self.store.for_slot(s).state()["current"] for s in slots},
            }
        except AgentError:
            return {}

    # --- MQTT -----------------------------------------------------------------------------------
    def _publish(self, slot: str, state: str, **fields: Any) -> None:
        """A status of model slot `slot`, on its topic; another slot's also refreshes the device's status."""
        self._last_fields[slot] = (state, fields)
        self._send(slot, state, fields)
        if slot != DEFAULT_SLOT and DEFAULT_SLOT in self._last_fields:
            self._send(DEFAULT_SLOT, *self._last_fields[DEFAULT_SLOT])

    def _send(self, slot: str, state: str, fields: dict[str, Any]) -> None:
        if slot != DEFAULT_SLOT:
            fields = {"model": slot, **fields}  # a status on a slot's own topic always names it
        fields = {**self._slots(slot), **fields}
        doc = status_doc(self.device, state, release=self._release(slot), floor=self._floors.get(slot), **fields)
        self._last_status[slot] = doc
        log.info("status %s %s", state, {k: v for k, v in fields.items() if k != "progress"})
        if self.client is not None and self.connected.is_set():
            self.client.publish(status_topic(self.device, slot), doc, qos=1, retain=True)

    def _make_client(self) -> Any:
        import paho.mqtt.client as mqtt

        client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,  # type: ignore[attr-defined]
            client_id=self.device,
            clean_session=True,
            protocol=mqtt.MQTTv311,
        )
        password = None
        if self.cfg.password_file:
            try:
                password = Path(self.cfg.password_file).read_text(encoding="utf-8").strip()
            except OSError as e:
                raise StateError(f"cannot read the broker password file: {e}") from None
        client.username_pw_set(self.cfg.username or self.device, password)
        if self.cfg.ca_file:
            client.tls_set(ca_certs=self.cfg.ca_file)
        client.on_connect = self._on_connect
        client.on_message = self._on_message
        client.on_disconnect = self._on_disconnect
        return client

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            log.warning("broker %s refused the connection: %s", self.cfg.broker, reason)
            return
        again = "reconnected" if self._ever_connected else "connected"
        log.info("%s to the broker %s as %s", again, self.cfg.broker, self.device)
        self._ever_connected = True
        self.connected.set()
        self._connects += 1
        client.subscribe([(desired_topic(self.device), 1), (desired_topic(self.device) + "/+", 1)])
        for slot, status in list(self._last_status.items()):
            client.publish(status_topic(self.device, slot), status, qos=1, retain=True)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        was_connected = self.connected.is_set()
        self.connected.clear()
        if was_connected and reason.is_failure and not self.stop.is_set():
            log.warning("lost the broker %s (%s): reconnecting", self.cfg.broker, reason)

    def _on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        topic, own = str(msg.topic), desired_topic(self.device)
        slot = DEFAULT_SLOT if topic == own else topic[len(own) + 1 :]
        if not (topic == own or (topic.startswith(own + "/") and slot != DEFAULT_SLOT and is_slot_name(slot))):
            log.warning("desired state on topic %s ignored: it names no model slot of this device", topic[:200])
            return
        with self._lock:
            self._inbox[slot] = bytes(msg.payload)
        self.wake.set()

    def _network(self) -> None:
        host, _, port = self.cfg.broker.rpartition(":")
        attempt = 0
        while not self.stop.is_set():
            self._connects = 0
            # the will is set before every connect, so it carries the release the device runs now; MQTT
            # takes a will only with CONNECT, so a new release means a clean reconnect (no will fired). Its
            # serial floor may be older than the device's (not worth a reconnect: the broker's retained
            # desired document holds the newer serial, and the controller reads both)
            will_release = self._release(DEFAULT_SLOT)
            offline = status_doc(self.device, "offline", release=will_release, floor=self._floors.get(DEFAULT_SLOT))
            self.client.will_set(status_topic(self.device), offline, qos=1, retain=True)
            try:
                self.client.connect(host, int(port), keepalive=self.cfg.keepalive_s)
                while not self.stop.is_set():
                    if self.client.loop(timeout=0.5) != 0:
                        break
                    if self.connected.is_set() and self._release(DEFAULT_SLOT) != will_release:
                        log.info(
                            "reconnecting: the broker's last will must name release %s", self._release(DEFAULT_SLOT)
                        )
                        self.client.disconnect()
                        self.client.loop(timeout=0.5)  # sends DISCONNECT: the broker drops the old will
                        break
            except (OSError, ValueError) as e:
                log.warning("cannot reach the broker %s: %s", self.cfg.broker, e)
            self.connected.clear()
            if self.stop.is_set():
                break
            attempt = 0 if self._connects else attempt + 1
            self.stop.wait(backoff_delay(attempt, self.cfg.backoff_min_s, self.cfg.backoff_max_s, self.rng))

    # --- the work -------------------------------------------------------------------------------
    def run(self, max_seconds: Optional[float] = None) -> int:
        watch_for_interruptions(self.store)  # a device whose service is stopped finishes a cut-off transition too
        self.client = self._make_client()
        self._connects = 0
        net = threading.Thread(target=self._network, name="mqtt", daemon=True)
        net.start()
        end = time.monotonic() + max_seconds if max_seconds else None
        try:
            while not self.stop.is_set():
                wait = self.cfg.poll_s if end is None else max(0.0, min(self.cfg.poll_s, end - time.monotonic()))
                fired = self.wake.wait(wait)
                self.wake.clear()
                with self._lock:
                    inbox, self._inbox = self._inbox, {}
                self._take(inbox)
                if inbox or not fired:
                    self._retry_unfinished(skip=set(inbox))
                if end is not None and time.monotonic() >= end:
                    break
        finally:
            self.stop.set()
            if self.connected.is_set():
                offline = status_doc(
                    self.device, "offline", release=self._release(DEFAULT_SLOT), floor=self._floors.get(DEFAULT_SLOT)
                )
                self.client.publish(status_topic(self.device), offline, qos=1, retain=True).wait_for_publish(2)
                self.client.disconnect()
            net.join(5)
        return 0

    def _take(self, inbox: dict[str, bytes]) -> None:
        """Act on each slot's newest message; those a still newer message pre-empts go back to the inbox."""
        items = list(inbox.items())
        for i, (slot, payload) in enumerate(items):
            if self.wake.is_set():
                with self._lock:
                    for later, data in items[i:]:
                        self._inbox.setdefault(later, data)
                return
            self._handle(slot, payload)

    def _handle(self, slot: str, payload: bytes) -> None:
        """Act on a desired document of model slot `slot`; a full disk (or a failing one) is that slot's refusal,
        and the watch keeps running."""
        try:
            self._act_on(slot, payload)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            log.warning("disk full: %s", e)
            self._publish(slot, "refused", code="no-space", message=f"the device root is full: {e}")

    def _act_on(self, slot: str, payload: bytes) -> None:
        data = self._load(slot)
        try:
            doc = verify_desired(payload, self.device, rollout_trust(self.store.root), data.get("serial"), model=slot)
        except DesiredRefused as e:  # names the serial it refuses: the controller waiting for it stops at once
            self._publish(
                slot, "refused", code=e.code, message=e.message, **({} if e.serial is None else {"serial": e.serial})
            )
            return
        if doc is None:
            return  # empty retained message: no instruction
        done = data.get("done") or {}
        if done.get("serial") == doc.serial and done.get("state") in TERMINAL:
            self._publish(slot, done["state"], **done.get("fields", {}))  # already acted on: say so again
            return
        data.update(serial=doc.serial, last=payload.decode())
        self._save(slot, data)
        self._apply(doc)

    def _retry_unfinished(self, skip: set[str]) -> None:
        """Each slot's last accepted document not finished (its registry was away, a newer document pre-empted
        it, or another deploy held the lock), but those of `skip`, just acted on: again, until a newer message
        comes."""
        for slot in self._known_slots():
            if slot in skip:
                continue
            if self.wake.is_set():
                return
            data = self._load(slot)
            if data.get("last") and (data.get("done") or {}).get("serial") != data.get("serial"):
                self._handle(slot, data["last"].encode())

    def _apply(self, doc: DesiredDoc) -> None:
        base = {"rollout": doc.rollout, "ref": doc.ref, "serial": doc.serial, "wave": doc.wave}
        if doc.action == "rollback":  # nothing to download: the release is on this device, or it is refused
            self._activate(doc, base, lambda: self._roll_back_to(doc))
            return
        if doc.jitter_s and self.wake.wait(self.rng.uniform(0, doc.jitter_s)):
            return  # a newer message arrived while waiting: the main loop takes it
        pulled = self._download(doc, base)
        if pulled is None:
            return
        manifest_sha, signature_sha = pulled
        self._activate(doc, base, lambda: self._deploy(doc, manifest_sha, signature_sha))

    def _deploy(self, doc: DesiredDoc, manifest_sha: str, signature_sha: Optional[str]) -> dict[str, Any]:
        store = self.store.for_slot(doc.model)
        source = BlobSource(store, manifest_sha, signature_sha)
        state = store.state()
        if state["previous"] and source.read()[0].release_name == state["previous"][0]:
            # the release this device kept: swap back to it, as `edgedeploy rollback` does over SSH (a
            # deploy would meet the serial floor)
            return rollback(store, make_service(store), doc.health.timeout_s)
        objectives = HealthObjectives(doc.health.min_inferences, doc.health.max_p95_ms, doc.health.min_fps)
        return Deployment(store, make_service(store)).deploy(
            source, timeout=doc.health.timeout_s, objectives=objectives
        )

    def _roll_back_to(self, doc: DesiredDoc) -> dict[str, Any]:
        """A fleet rollback: back to `doc.release`, what this device ran before the rollout it undoes."""
        store = self.store.for_slot(doc.model)
        state = store.state()
        if state["current"] == doc.release:  # e.g. its new release failed health and it went back by itself
            return {"outcome": "unchanged", "release": doc.release, "previous": doc.release}
        if state["previous"] and state["previous"][0] == doc.release:
            return rollback(store, make_service(store), doc.health.timeout_s)
        raise ReleaseNotKept(
            f"cannot roll back to {doc.release}: this device runs {state['current'] or 'nothing'} and kept "
            f"{state['previous'][0] if state['previous'] else 'nothing'} before it"
        )

    def _activate(self, doc: DesiredDoc, base: dict[str, Any], act: Callable[[], dict[str, Any]]) -> None:
        """act() under the slot's lock (DeviceStore.exclusive); its outcome (or why not) as the document's final
        status."""
        self._publish(doc.model, "activating", **base)
        try:
            with self.store.for_slot(doc.model).exclusive("deploy"):
                result = act()
        except StateError as e:
            if "another deploy" in e.message:  # someone (a technician over SSH) holds the lock: try again later
                self._publish(doc.model, "downloading", **base, code=e.code, message=e.message)
                return
            self._finish(doc, "refused", base, code=e.code, message=e.message)
        except HealthCheckFailed as e:
            self._finish(doc, "rolled-back", base, code=e.code, message=e.message)
        except AgentError as e:
            self._finish(doc, "refused", base, code=e.code, message=e.message)
        except OSError as e:  # the deploy path left the device on its release; crashing would retry it forever
            log.exception("deploy of %s failed", doc.ref)
            self._finish(doc, "refused", base, code="os-error", message=str(e))
        else:
            self._finish(doc, "committed", base, outcome=result["outcome"])

    def _download(self, doc: DesiredDoc, base: dict[str, Any]) -> Optional[tuple[str, Optional[str]]]:
        """(manifest sha, signature sha) once every blob is verified here; None if a newer document came."""
        try:
            ref = parse_ref(doc.ref)
        except AgentError as e:
            self._finish(doc, "refused", base, code=e.code, message=e.message)
            return None
        blobs = BlobStore(self.store.root)
        puller = OciPuller(self.cfg.registry_url, blobs)
        last = [0.0]

        def progress(done: int, total: int) -> None:
            if time.monotonic() - last[0] >= 1.0:
                last[0] = time.monotonic()
                self._publish(doc.model, "downloading", **base, progress={"bytes": done, "total": total})

        attempt = mismatches = 0
        self._publish(doc.model, "downloading", **base, progress={"bytes": 0, "total": None})
        while not self.stop.is_set():
            try:
                pulled = self._pull_unless_preempted(puller, ref, progress)
                if pulled is None:
                    return None  # a newer message (or stop): the main loop takes it; the .part files stay
                return pulled.manifest_sha, pulled.signature_sha
            except DigestMismatch as e:
                mismatches += 1
                if mismatches >= self.cfg.max_digest_failures:
                    self._finish(doc, "refused", base, code=e.code, message=e.message)
                    return None
                err: AgentError = e
            except PullError as e:
                err = e
            except AgentError as e:  # not an edgedeploy artifact
                self._finish(doc, "refused", base, code=e.code, message=e.message)
                return None
            except OSError as e:  # the device root is full (or failing): a refusal, never a crash
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self._finish(doc, "refused", base, code="no-space", message=f"the device root is full: {e}")
                return None
            # the status says why until a retry makes progress: what the controller quotes when it stops waiting
            self._publish(doc.model, "downloading", **base, code=err.code, message=err.message)
            attempt += 1
            if self.wake.wait(backoff_delay(attempt, self.cfg.backoff_min_s, self.cfg.backoff_max_s, self.rng)):
                return None  # a newer message: the main loop takes it (and may resume this download)
        return None

    def _pull_unless_preempted(
        self, puller: OciPuller, ref: Ref, progress: Callable[[int, int], None]
    ) -> Optional[Pulled]:
        """puller.pull in a thread while this one watches for a newer desired document: one arriving (or
        stop) aborts the pull within a chunk (a trickling registry, even a silent one: abort() shuts the socket
        down) and returns None, so a rollback is never stuck behind a download. The pull's errors are raised
        here, as if it ran in this thread."""
        outcome: dict[str, Any] = {}

        def work() -> None:
            try:
                outcome["pulled"] = puller.pull(ref, progress)
            except BaseException as e:  # handed to the watch's thread
                outcome["error"] = e

        worker = threading.Thread(target=work, name="pull", daemon=True)
        worker.start()
        while worker.is_alive():
            if self.wake.wait(0.2) or self.stop.is_set():  # not cleared: the main loop sees the news
                puller.abort()
                worker.join(10)
                log.info("download of %s pre-empted by a newer document", ref.sha[:16])
                return None
        if "error" in outcome:
            raise outcome["error"]
        pulled: Pulled = outcome["pulled"]
        return pulled

    def _finish(self, doc: DesiredDoc, state: str, base: dict[str, Any], **fields: Any) -> None:
        data = self._load(doc.model)
        data["done"] = {"serial": doc.serial, "state": state, "fields": {**base, **fields}}
        self._save(doc.model, data)
        self._publish(doc.model, state, **base, **fields)


def run_watch(store: DeviceStore, max_seconds: Optional[float] = None) -> int:
    store.require_initialised()
    cfg = WatchConfig.load(store.root)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s watch %(levelname)s %(message)s")
    watcher = Watcher(store, cfg)
    import signal

    def stop(*_: Any) -> None:
        watcher.stop.set()
        watcher.wake.set()

    signal.signal(signal.SIGTERM, stop)
    return watcher.run(max_seconds)
