"""How the agent's inference process is (re)started, and how it says it is healthy.

`process` mode runs a detached `edgedeploy-agent run` (containers, tests, devices without systemd);
`systemd` mode restarts the unit. Either way the running agent writes run/health.json, and
readiness means: bundle loaded, one warm-up inference passed and, with a source, the first real frames
served (see loop.run_agent).
"""

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Protocol

from .bundle import HealthSpec
from .durable import write_json_atomic
from .errors import StateError
from .heartbeat import BUILD_STATES, pid_alive
from .names import DEFAULT_SLOT
from .store import DeviceStore, make_dirs, utcnow
from .unit import restart_path_unit, restart_request, slot_unit

log = logging.getLogger("edgedeploy_agent.service")

HEALTHY_STATES = ("ready", "finished")


class Service(Protocol):
    def restart(self) -> None: ...

    def stop(self) -> None: ...

    def is_running(self) -> bool: ...


def write_health(store: DeviceStore, release: Optional[str], state: str, **extra: Any) -> None:
    data = {"release": release, "state": state, "pid": os.getpid(), "time": utcnow(), **extra}
    write_json_atomic(store.run_dir / "health.json", data)


def read_health(store: DeviceStore) -> Optional[dict[str, Any]]:
    try:
        data: dict[str, Any] = json.loads((store.run_dir / "health.json").read_text(encoding="utf-8"))
        return data
    except (FileNotFoundError, ValueError):
        return None


class NoFrames(TimeoutError):
    """The source delivered no (or too few) frames to show the bundle serving: not the bundle's fault."""


# health.json error codes that mean the source, not the bundle, failed
SOURCE_ERROR_CODES = ("source-error", "source-unavailable")


class ProcessService:
    """A detached `python -m edgedeploy_agent run` with a pid file."""

    # agents this process started, kept to be reaped when stopped (a process that deploys twice would otherwise
    # keep a zombie, and Python warns about a Popen dropped while its child runs)
    _started: dict[int, "subprocess.Popen[bytes]"] = {}

    def __init__(self, store: DeviceStore) -> None:
        self.store = store
        self.pidfile = store.run_dir / "agent.pid"

    def _pid(self) -> Optional[int]:
        try:
            return int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def is_running(self) -> bool:
        pid = self._pid()
        return pid is not None and pid_alive(pid)

    def stop(self, timeout: float = 10.0) -> None:
        pid = self._pid()
        if pid is None or not pid_alive(pid):
            self._reap(pid)
            self.pidfile.unlink(missing_ok=True)
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
        self._reap(pid)
        self.pidfile.unlink(missing_ok=True)

    def _reap(self, pid: Optional[int]) -> None:
        started = self._started.pop(pid, None) if pid is not None else None
        if started is not None:
            started.wait()

    def restart(self) -> None:
        self.stop()
        (self.store.run_dir / "health.json").unlink(missing_ok=True)
        for d in (self.store.logs, self.store.run_dir):
            make_dirs(d)
        log = open(self.store.log_path, "ab")
        try:
            stamp = utcnow()  # every line the agent writes starts with its time (agentlog.py)
            log.write(f"{stamp} edgedeploy-agent: starting {self.store.current() or 'no release'}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "edgedeploy_agent",
                    "--root",
                    str(self.store.root),
                    "run",
                    *slot_args(self.store),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                cwd=str(self.store.root),
            )
        finally:
            log.close()
        self._started[proc.pid] = proc
        self.pidfile.write_text(f"{proc.pid}\n")


class SystemdService:
    """The systemd unit; with Type=notify, `systemctl restart` returns once READY=1 was sent.

    A process that is not root restarts the unit through the restart path unit when it is installed (the
    watch service, under NoNewPrivileges=yes, cannot use sudo), else through the installer's sudoers rule. A
    model slot's path unit restarts the slot's unit that `agent install` made (unit.slot_unit); a unit that
    agent.json names instead is restarted through sudo only."""

    def __init__(self, store: DeviceStore, unit: str, request_wait_s: float = 60.0) -> None:
        self.store, self.unit, self.request_wait_s = store, unit, request_wait_s
        own = unit == slot_unit(store.slot)
        self.path_unit = restart_path_unit(store.slot) if own else None

    def _systemctl(self, *args: str, privileged: bool = False) -> "subprocess.CompletedProcess[str]":
        # a non-root deploying login may restart/stop exactly this unit through the installer's sudoers rule
        sudo = ["sudo", "-n"] if privileged and os.geteuid() != 0 else []
        return subprocess.run([*sudo, "systemctl", *args, self.unit], capture_output=True, text=True, timeout=300)

    def _show(self, prop: str, unit: Optional[str] = None) -> str:
        argv = ["systemctl", "show", "-p", prop, "--value", unit or self.unit]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()

    def _via_path_unit(self) -> bool:
        return (
            self.path_unit is not None and os.geteuid() != 0 and self._show("ActiveState", self.path_unit) == "active"
        )

    def _request_restart(self) -> None:
        """Write the request the path unit watches, then wait until a new invocation of the unit started."""
        before = self._show("InvocationID")
        write_restart_request(self.store.root / restart_request(self.store.slot), f"{utcnow()} pid {os.getpid()}\n")
        deadline = time.monotonic() + self.request_wait_s
        while time.monotonic() < deadline:
            if self._show("InvocationID") not in ("", before):
                return
            time.sleep(0.2)
        # not raised: the deploy's health check then fails with the old release still running, and rolls back
        log.warning("%s did not restart %s within %.0f s", self.path_unit, self.unit, self.request_wait_s)

    def restart(self) -> None:
        if self._show("LoadState") == "not-found":
            raise StateError(
                f"systemd has no unit {self.unit} to serve model {self.store.slot!r}",
                hint="run `edgedeploy agent install DEVICE` (it makes one unit per model in the inventory), or name "
                f'the unit in agent.json: "models": {{"{self.store.slot}": {{"unit": "UNIT"}}}}',
            )
        (self.store.run_dir / "health.json").unlink(missing_ok=True)
        if self._via_path_unit():
            self._request_restart()
            return
        # a deploy's restart is deliberate: it must not spend the unit's start limit (5 in 300 s), which is
        # there for crash loops; a push, a rollback (two starts) and a restart hit it within minutes.
        # reset-failed zeroes the counter (an older sudoers rule without it: the restart is tried anyway)
        self._systemctl("reset-failed", privileged=True)
        self._systemctl("restart", privileged=True)  # failure shows up in health.json / is_running

    def stop(self) -> None:
        self._systemctl("stop", privileged=True)

    def is_running(self) -> bool:
        return self._systemctl("is-active").stdout.strip() in ("active", "activating", "reloading")


def write_restart_request(path: Path, text: str) -> None:
    """Rewrite the request file in place (a close after writing is what PathChanged= sees; the content is only
    for a person reading it), group-writable so that the watch service and a deploying login can both write it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o660)
    except PermissionError:  # written by the other user before it was group-writable: replace it
        path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o660)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o660)  # the creating service's UMask=0027 took the group's write bit
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def make_service(store: DeviceStore) -> Service:
    """The service that serves this store's model slot: each slot has its own process (or unit)."""
    cfg = store.config()
    if cfg.service == "systemd":
        return SystemdService(store, cfg.unit)
    return ProcessService(store)


def slot_args(store: DeviceStore) -> list[str]:
    """`--model SLOT` for an agent command about this store's slot (none for `default`: as before slots)."""
    return [] if store.slot == DEFAULT_SLOT else ["--model", store.slot]


class HealthObjectives:
    """What "healthy" means beyond ready: N inferences done, and optional latency / FPS objectives."""

    def __init__(
        self, min_inferences: int = 0, max_p95_ms: Optional[float] = None, min_fps: Optional[float] = None
    ) -> None:
        self.min_inferences, self.max_p95_ms, self.min_fps = min_inferences, max_p95_ms, min_fps

    def with_bundle(self, spec: Optional[HealthSpec]) -> "HealthObjectives":
        """The bundle's own objectives, each overridden by the one given on the command line."""
        if spec is None:
            return self
        return HealthObjectives(
            max(self.min_inferences, spec.min_inferences),
            self.max_p95_ms if self.max_p95_ms is not None else spec.max_p95_ms,
            self.min_fps if self.min_fps is not None else spec.min_fps,
        )

    @property
    def needs_inferences(self) -> int:
        return max(self.min_inferences, 1 if self.max_p95_ms is not None or self.min_fps is not None else 0)

    def judge(self, health: dict[str, Any]) -> Optional[bool]:
        """True: met; None: not yet (too few inferences); raises RuntimeError when an objective is missed."""
        done = int(health.get("inferences") or 0)
        if done < self.needs_inferences:
            if health.get("state") == "finished":
                raise RuntimeError(f"source ended after {done} inferences, {self.needs_inferences} required")
            return None
        p95, fps = health.get("infer_p95_ms"), health.get("fps")
        if self.max_p95_ms is not None and (p95 is None or p95 > self.max_p95_ms):
            raise RuntimeError(f"inference p95 {p95} ms is above the objective {self.max_p95_ms} ms")
        if self.min_fps is not None and (fps is None or fps < self.min_fps):
            raise RuntimeError(f"{fps} FPS is below the objective {self.min_fps} FPS")
        return True


def wait_healthy(
    store: DeviceStore,
    service: Service,
    release: str,
    timeout: float,
    objectives: Optional[HealthObjectives] = None,
    build_timeout: Optional[float] = None,
) -> dict[str, Any]:
    """Wait until the agent reports `release` loaded, warmed up and meeting `objectives`.

    While the agent reports a TensorRT engine build (or its acceptance check), the wait extends to
    `build_timeout` seconds when one is given (`edgedeploy push --prebuild`). Raises TimeoutError or
    RuntimeError (with the reason) otherwise.
    """
    started = time.monotonic()
    deadline = started + timeout
    grace_until = started + 2.0  # a starting process may not have a pid yet
    building = None
    while time.monotonic() < deadline:
        health = read_health(store)
        if health and health.get("release") == release:
            if health.get("state") in HEALTHY_STATES:
                if objectives is None or objectives.judge(health):
                    return health
                time.sleep(0.1)
                continue
            if health.get("state") == "failed":
                err = health.get("error") or {}
                message = err.get("message", "agent reported failure")
                raise NoFrames(message) if err.get("code") in SOURCE_ERROR_CODES else RuntimeError(message)
            if health.get("state") in BUILD_STATES:
                building = health
                if build_timeout is not None:
                    deadline = max(deadline, started + build_timeout)
        if time.monotonic() > grace_until and not service.is_running():
            health = read_health(store)
            if health and health.get("release") == release and health.get("state") in HEALTHY_STATES:
                if objectives is None or objectives.judge(health):
                    return health
            log_tail = _tail(store.log_path)
            raise RuntimeError(f"agent exited before reporting ready{': ' + log_tail if log_tail else ''}")
        time.sleep(0.1)
    last = read_health(store) or {}
    if objectives is not None and last.get("release") == release and last.get("state") in HEALTHY_STATES:
        raise TimeoutError(
            f"ready, but {last.get('inferences') or 0} of {objectives.needs_inferences} required inferences "
            f"within {timeout:.0f} s"
        )
    if last.get("release") == release and last.get("state") == "checking-frames":
        raise NoFrames(
            f"source {last.get('source')} delivered {last.get('inferences') or 0} of the "
            f"{last.get('health_frames')} frames of the health check within {timeout:.0f} s"
        )
    if building is not None:
        raise TimeoutError(
            f"agent was still building or checking its TensorRT engine after {time.monotonic() - started:.0f} s "
            f"(last: {building.get('state')}, {building.get('elapsed_s', '?')} s into the build); "
            "push with --prebuild to wait for the engine build"
        )
    raise TimeoutError(f"agent did not report ready within {timeout:.0f} s")


def _tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except FileNotFoundError:
        return ""
    return " | ".join(text[-lines:])
