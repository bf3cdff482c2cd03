"""`edgedeploy-agent selftest`: can this device run what it should? A checklist, each line ok, warning or
failed, with the fix.

Every check is a small function over what it is given: the agent root, the system root (`/` on a device, a
fixture tree in tests), the health record, a command runner. None of them stops, restarts or reconfigures
the running service; the camera check leaves a camera the service holds to the service (selftest_hardware).
The host (`edgedeploy verify`) adds what only it can judge: the clock against its own, the agent's version
against its own.
"""

import datetime as _dt
import json
import platform
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from . import __version__
from .bundle import Manifest
from .config import AgentConfig
from .errors import AgentError
from .heartbeat import BUILD_STATES, present_health
from .store import SPACE_MARGIN_BYTES, DeviceStore
from .trust import TrustStore

OK, WARNING, FAILED = "ok", "warning", "failed"
_RANK = {OK: 0, WARNING: 1, FAILED: 2}
CLOCK_WARN_S = 2.0
CLOCK_FAIL_S = 60.0  # bundle expiry, serial checks and TLS certificates all read this clock
SPOOL_WARN_FRACTION = 0.8
LOGS = "edgedeploy logs DEVICE"

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Check:
    """One line of the checklist."""

    name: str
    status: str  # ok | warning | failed
    detail: str
    fix: Optional[str] = None
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Check":
        return cls(str(d["name"]), str(d["status"]), str(d["detail"]), d.get("fix"), dict(d.get("data") or {}))


def worst(statuses: Sequence[str]) -> str:
    """The overall status of a checklist: failed beats warning beats ok."""
    return max(statuses, key=lambda s: _RANK.get(s, 2), default=OK)


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def check_agent(python: str, machine: str, agent_version: str = __version__) -> Check:
    parts = tuple(int(x) for x in python.split(".")[:2] if x.isdigit())
    detail = f"edgedeploy-agent {agent_version}, Python {python} ({machine})"
    if parts < (3, 9):
        return Check("agent", FAILED, detail, "the agent needs Python 3.9 or newer: edgedeploy agent install --python")
    return Check("agent", OK, detail, data={"agent_version": agent_version, "python": python, "arch": machine})


def check_clock(
    device_time: float, bundle_created: Optional[_dt.datetime], host_window: Optional[tuple[float, float]] = None
) -> Check:
    """The device clock against the current bundle's build time and, from the host, against the host's clock.

    `host_window` is (host time the request was sent, host time the answer came back): the device read its
    clock in between, so the skew is known to within half the round trip.
    """
    now = _dt.datetime.fromtimestamp(device_time, _dt.timezone.utc)
    detail = f"device clock {now.isoformat(timespec='seconds')}"
    data: dict[str, Any] = {"time": device_time}
    fix = "set the clock (timedatectl set-ntp true, or date -s on a device without network) and check the RTC battery"
    if bundle_created is not None:
        created = bundle_created if bundle_created.tzinfo else bundle_created.replace(tzinfo=_dt.timezone.utc)
        if now < created:
            return Check("clock", FAILED, f"{detail} is before the current bundle was built ({created:%Y-%m-%d})", fix)
    if host_window is None:
        return Check("clock", OK, f"{detail} (not compared: run `edgedeploy verify` from the host)", data=data)
    sent, received = host_window
    skew, bound = device_time - (sent + received) / 2, (received - sent) / 2
    data.update(skew_s=round(skew, 3), uncertainty_s=round(bound, 3))
    off = max(abs(skew) - bound, 0.0)
    detail += f", {skew:+.1f} s from the host (±{bound:.1f} s)"
    if off > CLOCK_FAIL_S:
        return Check("clock", FAILED, detail + ": signed bundles may look expired, TLS may fail", fix, data)
    if off > CLOCK_WARN_S:
        return Check("clock", WARNING, detail, fix, data)
    return Check("clock", OK, detail, data=data)


def check_keys(root: Path, serial: Optional[int]) -> Check:
    try:
        keys = sorted(TrustStore(root).keys())
    except AgentError as e:
        return Check(
            "signing keys", FAILED, f"a pinned key is unreadable: {e.message}", "edgedeploy keys install DEVICE"
        )
    if not keys:
        return Check(
            "signing keys",
            WARNING,
            "no signing key pinned: this device accepts unsigned bundles",
            "edgedeploy keys install DEVICE (docs/fleet.md)",
        )
    floor = f", serial floor {serial}" if serial is not None else ""
    return Check("signing keys", OK, f"{len(keys)} pinned ({', '.join(keys)}){floor}", data={"keys": keys})


def _tree_bytes(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.glob("*.jsonl") if p.is_file()] if folder.is_dir() else []
    return len(files), sum(p.stat().st_size for p in files)


def check_disk(root: Path, release_bytes: int, spool_max_bytes: int, free_bytes: Optional[int] = None) -> Check:
    """Room for one more bundle like the current one (it is unpacked beside it) and the spool against its cap."""
    free = shutil.disk_usage(root).free if free_bytes is None else free_bytes
    pending, pending_bytes = _tree_bytes(root / "spool")
    sent, sent_bytes = _tree_bytes(root / "spool" / "sent")
    spool = pending_bytes + sent_bytes
    dropped = 0
    for counter in root.glob("models/*/run/spool_dropped"):  # each model slot's agent counts its own
        try:
            dropped += int(counter.read_text())
        except (OSError, ValueError):
            continue
    needed = 2 * release_bytes + SPACE_MARGIN_BYTES
    data = {"free_bytes": free, "needed_bytes": needed, "spool_bytes": spool, "pending_reports": pending}
    detail = (
        f"{_mib(free)} free under {root}; spool {spool / 1024:.0f} KiB of {_mib(spool_max_bytes)} "
        f"({pending} report files pending)"
    )
    if dropped:
        detail += f", {dropped} reports dropped at the cap so far"
    if free < needed:
        return Check("disk", FAILED, detail + f"; a push needs {_mib(needed)}", "free space on the device", data)
    if spool > SPOOL_WARN_FRACTION * spool_max_bytes:
        return Check("disk", WARNING, detail, "pull the reports: edgedeploy status DEVICE", data)
    if free < 4 * needed:
        return Check("disk", WARNING, detail + f"; little room left (a push needs {_mib(needed)})", None, data)
    return Check("disk", OK, detail, data=data)


def parse_systemctl_show(text: str) -> dict[str, str]:
    """Pure: `systemctl show UNIT -p A,B,...` prints one KEY=VALUE per line."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


SYSTEMCTL_PROPERTIES = (
    "LoadState,ActiveState,SubState,Result,NRestarts,ExecMainStatus,ExecMainCode,ActiveEnterTimestamp,UnitFileState"
)


def _run(argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30)


def check_service(cfg: AgentConfig, store: DeviceStore, health: Optional[dict[str, Any]], run: Runner = _run) -> Check:
    """systemd mode: the unit's state and why it last restarted; process mode: the pid file and last exit."""
    if cfg.service == "systemd":
        try:
            r = run(["systemctl", "show", cfg.unit, "-p", SYSTEMCTL_PROPERTIES])
        except (OSError, subprocess.SubprocessError) as e:
            return Check("service", FAILED, f"cannot run systemctl: {e}", "is this device's agent in systemd mode?")
        props = parse_systemctl_show(r.stdout)
        return judge_unit(cfg.unit, props, r.stderr.strip())
    from .service import ProcessService

    last = (health or {}).get("state")
    if ProcessService(store).is_running():
        return Check("service", OK, "process mode: the agent process is running (nothing restarts it if it dies)")
    if store.current() is None:
        return Check(
            "service", WARNING, "process mode: not running (no bundle deployed)", "edgedeploy push DEVICE BUNDLE"
        )
    if last == "finished":
        return Check("service", OK, "process mode: the agent played its source to the end and exited")
    if last == "stopped":
        return Check("service", WARNING, "process mode: the agent was stopped", "edgedeploy push DEVICE BUNDLE --force")
    return Check(
        "service", FAILED, f"process mode: the agent is not running (last state {last})", f"{LOGS}; push again"
    )


def judge_unit(unit: str, props: dict[str, str], stderr: str = "") -> Check:
    """Pure: the unit's properties -> a check line."""
    if props.get("LoadState") != "loaded":
        why = props.get("LoadState") or stderr.splitlines()[-1:] or "no answer"
        return Check("service", FAILED, f"{unit} is not loaded ({why})", "edgedeploy agent install DEVICE")
    state, sub, result = props.get("ActiveState", "?"), props.get("SubState", "?"), props.get("Result", "?")
    restarts = int(props.get("NRestarts") or 0)
    exit_info = f"last exit {props.get('ExecMainCode', '?')}/{props.get('ExecMainStatus', '?')}"
    detail = f"{unit} {state} ({sub}), result {result}, {restarts} restart(s)"
    if props.get("ActiveEnterTimestamp"):
        detail += f", since {props['ActiveEnterTimestamp']}"
    data = {"properties": props}
    if state in ("failed", "inactive"):
        return Check("service", FAILED, f"{detail}; {exit_info}", f"{LOGS}, then push or restart the unit", data)
    if state != "active" or restarts or result != "success":
        return Check("service", WARNING, f"{detail}; {exit_info}", f"{LOGS} says why it restarted", data)
    return Check("service", OK, detail, data=data)


def check_health(store: DeviceStore, current: Optional[str], state: dict[str, Any]) -> Check:
    """The running release as the agent reports it (health.json, `dead` when its writer is gone)."""
    from .service import read_health

    if state.get("pending"):
        p = state["pending"]
        return Check("health", WARNING, f"a deploy of {p.get('release')} is in flight ({p.get('state')})", None)
    if current is None:
        return Check("health", WARNING, "no bundle deployed", "edgedeploy push DEVICE BUNDLE")
    h = present_health(store.run_dir, read_health(store))
    if h is None:
        return Check("health", FAILED, f"{current} is current but the agent never reported", f"{LOGS}")
    st = h.get("state")
    data = {k: h.get(k) for k in ("state", "release", "inferences", "infer_p95_ms", "fps") if h.get(k) is not None}
    if h.get("release") != current:
        return Check("health", WARNING, f"health.json is about {h.get('release')}, current is {current}", LOGS, data)
    if st in ("ready", "finished"):
        numbers = f", {h.get('inferences') or 0} inferences"
        if h.get("fps"):
            numbers += f", {h['fps']} FPS, inference p95 {h.get('infer_p95_ms')} ms"
        return Check("health", OK, f"{current} {st}{numbers}", data=data)
    if st == "dead":
        return Check("health", FAILED, f"{current}: agent dead ({h.get('dead_because')})", f"{LOGS}; then push", data)
    if st == "failed":
        err = h.get("error") or {}
        code = err.get("code", "agent-error")
        return Check(
            "health",
            FAILED,
            f"{current} failed [{code}]: {err.get('message')}",
            f"{LOGS}; docs/troubleshooting.md#{code}",
            data,
        )
    if st in ("loading", "checking-frames", *BUILD_STATES):
        return Check("health", WARNING, f"{current} is {st}", "wait, then verify again", data)
    return Check("health", WARNING, f"{current} is {st}", f"{LOGS}", data)


def check_release_files(store: DeviceStore, current: Optional[str]) -> Check:
    """The current release's artifacts still hash to its manifest (an SD card that corrupts files says so here)."""
    if current is None:
        return Check("release files", OK, "no bundle deployed")
    try:
        manifest = store.load_release(current)
    except AgentError as e:
        # a blob push would link the device's stored (corrupt) copy again: unpack the bundle file instead
        fix = "check the storage (dmesg, the SD card), then on the device: edgedeploy-agent install-bundle FILE --force"
        return Check("release files", FAILED, e.message, fix)
    size = sum(a.size for a in manifest.artifacts)
    detail = f"{current}: {len(manifest.artifacts)} artifacts, {size / 1e6:.1f} MB, hashes match"
    return Check("release files", OK, detail)


def release_manifest(store: DeviceStore, current: Optional[str]) -> Optional[Manifest]:
    from .lifecycle import read_manifest_from_release

    if current is None:
        return None
    try:
        return read_manifest_from_release(store, current)
    except (OSError, ValueError):
        return None


def latest_report(store: DeviceStore, source: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The newest report the running agent spooled (pending or already pulled); of `source` when given (an agent
    with several sources spools one report per source)."""
    files = sorted([*store.spool.glob("*.jsonl"), *(store.spool / "sent").glob("*.jsonl")], key=lambda p: p.name)
    for p in reversed(files):
        try:
            lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.strip()]
            data: dict[str, Any] = json.loads(lines[-1])
        except (OSError, ValueError, IndexError):
            continue
        if source is None or data.get("source") == source:
            return data
    return None


def checklist_lines(result: dict[str, Any]) -> list[str]:
    """The checklist as text: one line per check, and its fix under any that is not ok."""
    out = []
    for c in result["checks"]:
        mark = "ok" if c["status"] == OK else c["status"].upper()
        out.append(f"  {mark:<8} {c['name']:<19} {c['detail']}")
        if c.get("fix") and c["status"] != OK:
            out.append(f"  {'':<8} {'':<19} fix: {c['fix']}")
    return out


def checklist_text(result: dict[str, Any]) -> str:
    return "\n".join([f"{result['device']}: {result['overall']}", *checklist_lines(result)])


def guarded(name: str, check: Callable[[], Check]) -> Check:
    """One check; whatever it raises becomes its own failed line, so the rest of the checklist still runs."""
    try:
        return check()
    except Exception as e:  # a driver, a sysfs file or a library can fail in any way on a real device
        return Check(name, FAILED, f"the check itself failed: {type(e).__name__}: {e}", f"{LOGS}; report it")


def run_selftest(store: DeviceStore, sys_root: Path = Path("/"), camera_seconds: float = 5.0) -> dict[str, Any]:
    """Every check, in the order a technician reads them. Never raises for a failed check."""
    from . import selftest_hardware as hw
    from .service import read_health

    started = time.time()
    store.require_initialised()
    cfg, state = store.config(), store.state()
    current = store.current()
    manifest = release_manifest(store, current)
    health = present_health(store.run_dir, read_health(store))
    serving = bool(health and health.get("release") == current and health.get("state") in ("ready", "checking-frames"))
    release_bytes = sum(a.size for a in manifest.artifacts) if manifest else 0
    cameras: list[Optional[str]] = [*cfg.source_uris] or [None]  # each source gets its camera check
    plan: list[tuple[str, Callable[[], Check]]] = [
        ("agent", lambda: check_agent(platform.python_version(), platform.machine())),
        (
            "tvm runtime",
            lambda: hw.check_runtime(manifest, cfg.tvm_runtime_lib, (cfg.cuda_backend, cfg.cuda_backend_lib)),
        ),
        ("bundle vs hardware", lambda: hw.check_bundle_fit(manifest, cpuinfo=sys_root / "proc" / "cpuinfo")),
        ("tensorrt", lambda: hw.check_tensorrt(manifest, health, store.root / "engines")),
        # (several sources: the first tells which Python captures)
        ("pythons", lambda: hw.check_pythons(cfg.system_python, manifest, cameras[0])),
        *[
            (
                "camera",
                lambda uri=uri: hw.check_camera(
                    uri, serving, latest_report(store, uri), seconds=camera_seconds, system_python=cfg.system_python
                ),
            )
            for uri in cameras
        ],
        ("power", lambda: hw.check_power(sys_root)),
        ("thermal", lambda: hw.check_thermal(sys_root)),
        ("disk", lambda: check_disk(store.root, release_bytes, cfg.spool_max_bytes)),
        ("clock", lambda: check_clock(started, manifest.created if manifest else None)),
        ("signing keys", lambda: check_keys(store.root, (state.get("serial") or {}).get("serial"))),
        ("service", lambda: check_service(cfg, store, health)),
        ("release files", lambda: check_release_files(store, current)),
        ("health", lambda: check_health(store, current, state)),
    ]
    checks = [guarded(name, fn) for name, fn in plan]
    return {
        "device": cfg.device_name,
        "time": started,
        "overall": worst([c.status for c in checks]),
        "checks": [c.as_dict() for c in checks],
    }
