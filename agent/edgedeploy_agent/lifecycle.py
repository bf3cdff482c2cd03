"""The deployment state machine, persisted in state.json so a crash or reboot resumes it.

    deploy:           staged -> verified -> activating -> health-check -> committed
                         \\----------\\-> failed      \\-----------------\\-> rolled-back
    manual rollback:  activating -> health-check -> committed | rolled-back

Every transition goes through `Transition`, which persists it as `pending` in state.json at each step
before the step's work; `current` in state.json changes only at commit. If the agent dies mid-way (in a
deploy or a rollback alike), `recover()` (run before every deploy and rollback, and at `facts`) puts the
device back on the last committed release.

A refused bundle (untrusted, incompatible, unreadable, failing to stage) leaves nothing behind: its
uploaded file or blobs are removed at refusal, and `recover()` sweeps uploads nobody will use.
"""

import datetime as _dt
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional, Protocol, Union

from .blobs import BlobStore, FileSource
from .bundle import Manifest, check_compatible
from .errors import AgentError, HealthCheckFailed, SourceUnavailable, StateError
from .gpu import probe_cuda
from .service import HealthObjectives, NoFrames, Service, read_health, slot_args, wait_healthy
from .store import DeviceStore, utcnow
from .trust import TrustStore, check_trust
from .uploads import remove_stale_uploads


class BundleSource(Protocol):
    """Where a deploy's bundle comes from: one uploaded file or blobs (see blobs.py)."""

    def read(self) -> tuple[Manifest, bytes, Optional[bytes]]: ...

    def stage(self, store: DeviceStore) -> Manifest: ...

    def verify(self) -> None:
        """Check what was uploaded against its manifest without installing it (a bundle found unchanged is
        still refused when tampered); raises BundleError."""

    def discard(self) -> None:
        """Called once the bundle is staged (or unchanged): drop what the release no longer needs."""

    def remove_refused(self) -> None:
        """Called when the device refuses the bundle: remove everything its upload left."""


TRANSITIONS = {
    None: {"staged", "activating"},  # a deploy stages a new bundle; a rollback activates a release it kept
    "staged": {"verified", "failed"},
    "verified": {"activating", "failed"},
    "activating": {"health-check", "rolled-back"},
    "health-check": {"committed", "rolled-back"},
}


class Transition:
    """The one transition in flight on a device, persisted as state["pending"] at every step."""

    def __init__(self, store: DeviceStore, state: dict[str, Any], kind: str, release: str) -> None:
        self.store, self.state, self.release = store, state, release
        self.previous: Optional[str] = state["current"]
        state["pending"] = {"kind": kind, "release": release, "from": self.previous, "state": None, "started": utcnow()}

    @classmethod
    def resume(cls, store: DeviceStore, state: dict[str, Any]) -> "Transition":
        """The transition state["pending"] describes, picked up where it was cut off."""
        self = cls.__new__(cls)
        self.store, self.state, self.release = store, state, state["pending"]["release"]
        self.previous = state["pending"].get("from", state["current"])
        return self

    def move(self, to: str) -> None:
        pending = self.state["pending"]
        frm = pending["state"]
        if to not in TRANSITIONS.get(frm, set()):
            raise StateError(f"invalid transition {frm} -> {to}")
        pending["state"] = to
        pending["updated"] = utcnow()
        self.store.save_state(self.state)

    def commit(self, event: str, serial: Optional[dict[str, Any]] = None) -> None:
        """The release is healthy: it becomes `current`, the one it replaced heads `previous`."""
        self.move("committed")
        state, name, old = self.state, self.release, self.previous
        state["current"] = name
        if old and old != name:
            state["previous"] = [old] + [p for p in state["previous"] if p not in (old, name)]
        state["previous"] = [p for p in state["previous"] if p != name]
        if serial is not None:
            state["serial"] = serial
        self.store.record(state, event, name, f"from {old}")
        self._end()

    def abort(self, to: str, event: str, reason: str) -> None:
        """The transition ends without changing `current` (`to`: failed or rolled-back)."""
        self.move(to)
        self.store.record(self.state, event, self.release, reason)
        self._end()

    def _end(self) -> None:
        self.state["pending"] = None
        self.store.save_state(self.state)


class Deployment:
    """One deploy of one bundle file onto one device store."""

    def __init__(self, store: DeviceStore, service: Service) -> None:
        self.store, self.service = store, service
        self.timings: dict[str, float] = {}

    def deploy(
        self,
        bundle: Union[Path, "BundleSource"],
        timeout: float,
        force: bool = False,
        objectives: Optional[HealthObjectives] = None,
        build_timeout: Optional[float] = None,
    ) -> dict[str, Any]:
        source = FileSource(bundle, self.store) if isinstance(bundle, Path) else bundle
        recover(self.store, self.service)
        state = self.store.state()
        try:
            manifest, body, signature = source.read()
            gpu, reason = probe_cuda() if manifest.target.device == "cuda" else (None, "")
            check_compatible(manifest, gpu=gpu, gpu_reason=reason)
            check_trust(
                TrustStore(self.store.root), manifest, body, signature, state.get("serial"), self.store.config().profile
            )
        except AgentError:
            source.remove_refused()
            raise
        name = manifest.release_name
        old = state["current"]
        health = read_health(self.store)
        # the same bundle again: nothing to do while it serves (a service that stopped, or whose source
        # ended, is started again by the deploy below), once the upload is checked like any other
        if (
            not force
            and old == name
            and self.service.is_running()
            and health
            and health.get("release") == name
            and health.get("state") in ("ready", "finished")
        ):
            try:
                source.verify()
            except AgentError:
                source.remove_refused()
                raise
            source.discard()
            return {"outcome": "unchanged", "release": name, "previous": state["previous"][:1] or [None]}

        transition = Transition(self.store, state, "deploy", name)
        transition.move("staged")
        t = time.monotonic()
        try:
            source.stage(self.store)
        except Exception as e:
            source.remove_refused()
            transition.abort("failed", "stage-failed", str(e))
            raise
        source.discard()  # the release holds the bundle now, whatever its health check says
        self.timings["verify_unpack_s"] = round(time.monotonic() - t, 3)
        transition.move("verified")

        transition.move("activating")
        self.store.activate(name)
        t = time.monotonic()
        self.service.restart()
        transition.move("health-check")
        try:
            wanted = (objectives or HealthObjectives()).with_bundle(manifest.health)
            health = wait_healthy(self.store, self.service, name, timeout, wanted, build_timeout)
        except (RuntimeError, TimeoutError) as e:
            self.timings["health_wait_s"] = round(time.monotonic() - t, 3)
            reason = str(e)
            back = self._roll_back(transition, reason, timeout)
            if isinstance(e, NoFrames):  # the source failed, not the bundle: say so
                raise SourceUnavailable(
                    f"bundle {name} could not be shown serving: {reason}; device is back on {back or 'no bundle'}",
                    hint="check the device's frame source (camera cable, stream URL, file), then push again",
                ) from None
            raise HealthCheckFailed(
                f"bundle {name} failed its health check: {reason}; device is back on {back or 'no bundle'}",
                hint=f"see the agent's log: `{' '.join(['edgedeploy logs DEVICE', *slot_args(self.store)])}` (on "
                f"the device, the journal in systemd mode, else ROOT/logs/{self.store.log_path.name})",
            ) from None
        self.timings["health_wait_s"] = round(time.monotonic() - t, 3)
        build_s = (health.get("runtime") or {}).get("build_s")
        if build_s is not None:
            self.timings["engine_build_s"] = build_s

        serial = None if manifest.serial is None else {"serial": manifest.serial, "bundle_id": manifest.bundle_id}
        transition.commit("committed", serial)
        cfg = self.store.config()
        removed = self.store.prune([name, *state["previous"]], cfg.keep_releases)
        state["previous"] = [p for p in state["previous"] if p not in removed]
        self.store.save_state(state)
        with self.store.sole_blob_user() as sole:
            if sole:  # else another slot's transition may be linking blobs: the last one to end collects
                BlobStore(self.store.root).collect_garbage()
        return {"outcome": "committed", "release": name, "previous": old, "health": health, "timings": self.timings}

    def _roll_back(self, transition: Transition, reason: str, timeout: float) -> Optional[str]:
        old = transition.previous
        self.store.activate(old)
        if old:
            self.service.restart()
            try:
                wait_healthy(self.store, self.service, old, timeout)
            except (RuntimeError, TimeoutError) as e:
                reason += f"; the previous bundle {old} did not come back healthy either: {e}"
        else:
            self.service.stop()
        transition.abort("rolled-back", "rolled-back", reason)
        return old


def recover(store: DeviceStore, service: Service) -> Optional[str]:
    """Finish an interrupted transition: anything not committed goes back to the last committed release.

    A stage killed with its SSH session (SIGKILL, SIGHUP: no `finally` runs) leaves releases/.tmp-<release>
    behind; it goes too, and so do uploads no push in flight can still use (uploads.py). Callers hold the
    store's `exclusive` lock, so no stage is in flight.
    """
    leftovers = store.remove_staging_leftovers()
    remove_stale_uploads(store)
    state = store.state()
    pending = state.get("pending")
    if not pending:
        return None
    old: Optional[str] = state["current"]
    if store.current() != old:
        store.activate(old)
        if old:
            service.restart()
        else:
            service.stop()
    detail = f"interrupted in state {pending.get('state')}" + (f"; removed {', '.join(leftovers)}" if leftovers else "")
    store.record(state, "recovered", pending.get("release"), detail)
    state["pending"] = None
    store.save_state(state)
    return old


FINISH_HEALTH_TIMEOUT_S = 120.0  # the health check a device finishes by itself (no host to say otherwise)
FINISH_CHECK_EVERY_S = 10.0  # how often a running service looks for an interrupted transition
# how long a cut-off transition is left to a host that is still connected (a push whose agent was killed runs
# `recover` and reads the device back within seconds) before the device finishes it by itself
FINISH_GRACE_S = 5.0


def interrupted(store: DeviceStore, grace_s: float = FINISH_GRACE_S) -> Optional[dict[str, Any]]:
    """The pending transition nobody runs: every deploy, rollback and recovery holds the device lock for the
    whole transition, and the kernel drops a dead process's lock, so a pending transition with the lock free was
    cut off (its SSH session killed, its process or the device died). Only once the transition has not moved for
    `grace_s` s: a host still connected recovers and reads the device back first. Read only."""
    try:
        pending: Optional[dict[str, Any]] = store.state().get("pending")
    except AgentError:
        return None
    if not pending or _quiet_s(pending) < grace_s or store.busy():
        return None
    return pending


def _quiet_s(pending: dict[str, Any]) -> float:
    """Seconds since the transition last moved (`updated`, else `started`, both store.utcnow()); unreadable:
    long ago."""
    try:
        moved = _dt.datetime.fromisoformat(str(pending.get("updated") or pending.get("started")))
        return (_dt.datetime.now(_dt.timezone.utc) - moved).total_seconds()
    except (TypeError, ValueError):
        return float("inf")


def spawn_finisher(store: DeviceStore) -> None:
    """`edgedeploy-agent recover --finish` in a session of its own: it outlives the service that starts it (it
    restarts that service) and takes the device lock itself (a second one is refused by the lock)."""
    log = open(store.log_path, "ab")
    try:
        log.write(f"{utcnow()} edgedeploy-agent: finishing an interrupted transition\n".encode())
        log.flush()
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "edgedeploy_agent",
                "--root",
                str(store.root),
                "--json",
                "recover",
                "--finish",
                *slot_args(store),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            cwd=str(store.root),
        )
    finally:
        log.close()


def watch_for_interruptions(store: DeviceStore, every: float = FINISH_CHECK_EVERY_S) -> Optional[threading.Thread]:
    """For a long-running process (the service, the watch): now and every `every` s, a transition nobody runs
    is finished by a spawned finisher (at most one per FINISH_HEALTH_TIMEOUT_S).

    Process mode only: in systemd mode the finisher would be in the unit's cgroup, and the restart it asks for
    would kill it mid-transition. There edgedeploy-agent-finish.timer starts the same finisher in a unit of its own
    (edgedeploy-agent-finish.service), which also runs when the inference unit is stopped."""
    try:
        if store.config().service != "process":
            return None
    except AgentError:
        return None

    def check() -> None:
        last = -FINISH_HEALTH_TIMEOUT_S
        while True:
            if interrupted(store) and time.monotonic() - last >= FINISH_HEALTH_TIMEOUT_S:
                last = time.monotonic()
                try:
                    spawn_finisher(store)
                except OSError as e:
                    print(f"edgedeploy-agent: cannot start the finisher: {e}", file=sys.stderr, flush=True)
            time.sleep(every)

    thread = threading.Thread(target=check, name="interrupted", daemon=True)
    thread.start()
    return thread


def finish_interrupted(
    store: DeviceStore, service: Service, timeout: float = FINISH_HEALTH_TIMEOUT_S
) -> Optional[dict[str, Any]]:
    """Finish a transition a lost connection cut off, on the device alone (as Mender and RAUC devices do).

    A deploy cut off while `activating` or in its `health-check` (its release is whole: it was verified and
    its signature, serial and profile checked before the transition began) gets its health check run again on
    real frames, against the bundle's own objectives (the host's command-line objectives went with the host):
    healthy, it is committed; not, the device goes back to the release it ran before and that is restarted.
    Anything else (a stage cut off, a rollback) goes back to the last committed release (`recover`), and that
    release is restarted if it is not serving. Callers hold `exclusive`. Returns what was done, or None."""
    state = store.state()
    pending = state.get("pending")
    if not pending:
        return None
    release, step = pending.get("release"), pending.get("state")
    if pending.get("kind") == "deploy" and step in ("activating", "health-check") and release:
        try:
            manifest = store.load_release(release)
        except AgentError:
            manifest = None
        if manifest is not None:
            transition = Transition.resume(store, state)
            if step == "activating":
                transition.move("health-check")
            store.activate(release)
            service.restart()
            try:
                wait_healthy(store, service, release, timeout, HealthObjectives().with_bundle(manifest.health))
            except (RuntimeError, TimeoutError) as e:
                back = Deployment(store, service)._roll_back(transition, f"after an interruption: {e}", timeout)
                return {"outcome": "rolled-back", "release": back, "refused": release, "reason": str(e)}
            serial = None if manifest.serial is None else {"serial": manifest.serial, "bundle_id": manifest.bundle_id}
            transition.commit("committed-after-interruption", serial)
            return {"outcome": "committed", "release": release, "previous": transition.previous}
    old = recover(store, service)
    if old and not service.is_running():
        service.restart()
    return {"outcome": "recovered", "release": old, "interrupted": step}


def rollback(store: DeviceStore, service: Service, timeout: float) -> dict[str, Any]:
    """Go back to the newest previous release by hand."""
    recover(store, service)
    state = store.state()
    if not state["previous"]:
        raise StateError("no previous release to roll back to")
    target, current = state["previous"][0], state["current"]
    transition = Transition(store, state, "rollback", target)
    transition.move("activating")
    store.activate(target)
    service.restart()
    transition.move("health-check")
    try:
        wait_healthy(store, service, target, timeout)
    except (RuntimeError, TimeoutError) as e:
        store.activate(current)
        if current:
            service.restart()
        else:
            service.stop()
        transition.abort("rolled-back", "manual-rollback-failed", str(e))
        raise HealthCheckFailed(f"previous release {target} is not healthy ({e}); stayed on {current}") from None
    transition.commit("manual-rollback")
    return {"outcome": "rolled-back", "release": target, "previous": current}


def describe_release(store: DeviceStore, name: Optional[str]) -> Optional[dict[str, Any]]:
    if not name:
        return None
    try:
        m = read_manifest_from_release(store, name)
    except Exception:
        return {"release": name, "readable": False}
    return {
        "release": name,
        "model": m.model.name,
        "version": m.model.version,
        "profile": m.profile,
        "bundle_id": m.bundle_id,
    }


def read_manifest_from_release(store: DeviceStore, name: str) -> Manifest:
    return Manifest.model_validate_json((store.release_dir(name) / "manifest.json").read_bytes())
