"""`agent install --mqtt BROKER --registry URL`: the opt-in part of the install that sets a device up for pull
rollouts (docs/fleet.md). Its facts come from the install's one probe (PULL_PROBE is appended to it); the
pure planner adds, each only when the device lacks it: the device's broker password (made here, uploaded
through a private folder, 0600 for the service user), the fleet CA, `edgedeploy-agent watch-config` run as
the service user (broker, read-only registry endpoint, pinned rollout key), and the watch service. The restart
path unit it restarts the inference unit through (restarts without sudo, docs/agent-service.md) comes with every
systemd install (remote/install.py).

The broker's side: the device's user is added to a mosquitto password file on this host when one is given
(`--broker-passwd`), and the password is kept in STATE/mqtt-devices/<device> (0600) either way.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from pydantic import ValidationError

from edgedeploy_agent.durable import write_atomic
from edgedeploy_agent.trust import key_id, parse_public_key
from edgedeploy_agent.unit import WATCH_UNIT, render_unit

from ..errors import InputError, validation_text
from ..fleet_servers import mosquitto_passwd_text
from ..paths import state_dir
from .install import InstallSpec, Step, unit_steps

if TYPE_CHECKING:
    from edgedeploy_agent.watch import WatchConfig

PULL_UNITS = (WATCH_UNIT,)  # restarts without sudo come with every systemd install (remote/install.py)
PASSWORD = "mqtt-password"
FLEET_CA = "fleet-ca.crt"
# appended to the install probe (remote/install.py), where $root is the agent root; the unit names are constants
PULL_PROBE = r"""
[ -f "$root/watch.json" ] && echo "watch_config_sha256=$(sha256sum "$root/watch.json" | cut -d' ' -f1)"
[ -e "$root/mqtt-password" ] && echo "mqtt_password=1"
[ -f "$root/fleet-ca.crt" ] && echo "fleet_ca_sha256=$(sha256sum "$root/fleet-ca.crt" | cut -d' ' -f1)"
echo "rollout_keys=$(ls "$root/trust/rollout" 2>/dev/null | sed -n 's/\.pub$//p' | tr '\n' ' ')"
u=edgedeploy-agent-watch.service
[ -f "/etc/systemd/system/$u" ] && echo "unit_sha256:$u=$(sha256sum "/etc/systemd/system/$u" | cut -d' ' -f1)"
true
"""


@dataclass(frozen=True)
class PullOptions:
    """What `agent install --mqtt` was asked for."""

    broker: str  # HOST:PORT as the device reaches it
    registry: str  # the device's read-only endpoint, e.g. http://site-cache:5000
    rollout_key: str  # ed25519:<base64>, the public half of the key that signs desired state
    ca_file: Path | None = None  # fleet CA: the device connects to the broker with TLS
    broker_passwd: Path | None = None  # a mosquitto password file on this host to add the device's user to


@dataclass(frozen=True)
class PullFacts:
    watch_config_sha256: str | None
    mqtt_password: bool
    fleet_ca_sha256: str | None
    rollout_keys: tuple[str, ...]
    unit_sha256: dict[str, str]


def parse_pull_probe(stdout: str) -> PullFacts:
    """Pure: PULL_PROBE's key=value lines -> PullFacts."""
    kv = dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)
    units = {k.split(":", 1)[1]: v for k, v in kv.items() if k.startswith("unit_sha256:")}
    return PullFacts(
        watch_config_sha256=kv.get("watch_config_sha256") or None,
        mqtt_password=kv.get("mqtt_password") == "1",
        fleet_ca_sha256=kv.get("fleet_ca_sha256") or None,
        rollout_keys=tuple(sorted(kv.get("rollout_keys", "").split())),
        unit_sha256=units,
    )


class PullFiles(NamedTuple):
    """What the plan uploads or compares, rendered here."""

    units: dict[str, Path]
    watch_config: Path  # the watch.json watch-config will write (compared by sha256)
    password: Path  # a new broker password, uploaded only if the device has none
    upload_dir: str  # a private folder on the device for the password, unguessable


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _watch_config(spec: InstallSpec, pull: PullOptions) -> WatchConfig:
    from edgedeploy_agent.watch import WatchConfig

    fields = {
        "broker": pull.broker,
        "registry_url": pull.registry,
        "password_file": f"{spec.root}/{PASSWORD}",
        "ca_file": f"{spec.root}/{FLEET_CA}" if pull.ca_file else None,
    }
    try:
        return WatchConfig.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        raise InputError(f"--mqtt/--registry: {validation_text(e)}", hint="--mqtt HOST:PORT --registry URL") from None


def write_pull_files(spec: InstallSpec, pull: PullOptions, work_dir: Path) -> PullFiles:
    """The three units for this device, the watch.json to expect, and a fresh broker password."""
    units = {}
    for name in PULL_UNITS:
        argv = [f"{spec.venv}/bin/edgedeploy-agent", "--root", spec.root, "watch"] if name == WATCH_UNIT else None
        try:
            text = render_unit(argv, user=spec.user, root=spec.root, name=name)
        except ValueError as e:
            raise InputError(f"cannot write {name}: {e}", hint="choose --venv and --root without spaces") from None
        (work_dir / name).write_text(text, encoding="utf-8")
        units[name] = work_dir / name
    config = work_dir / "watch.json"
    config.write_text(_watch_config(spec, pull).model_dump_json(indent=1), encoding="utf-8")
    password = work_dir / PASSWORD
    fd = os.open(password, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(24) + "\n")
    return PullFiles(units, config, password, f"/tmp/edgedeploy-install-{secrets.token_hex(8)}")


def plan_pull(facts: PullFacts, spec: InstallSpec, pull: PullOptions, files: PullFiles) -> list[Step]:
    """Pure: the steps still needed for pull rollouts on a device that looks like `facts`."""
    if spec.mode != "systemd":
        raise InputError(
            "--mqtt installs the watch service: the device needs service = systemd",
            hint="in process mode run `edgedeploy-agent watch-config` and `edgedeploy-agent watch` yourself",
        )
    user, root = spec.user, spec.root
    steps: list[Step] = []
    if not facts.mqtt_password:
        tmp = f"{files.upload_dir}/{PASSWORD}"
        steps += [
            Step("make a private upload folder", ("install", "-d", "-m", "0700", files.upload_dir)),
            Step("upload broker password", put=(files.password, tmp)),
            Step(
                "install broker password",
                ("install", "-m", "0600", "-o", user, "-g", user, tmp, f"{root}/{PASSWORD}"),
                root=True,
            ),  # fmt: skip
            Step("remove the upload folder", ("rm", "-rf", files.upload_dir)),
        ]
    if pull.ca_file is not None and facts.fleet_ca_sha256 != _sha256(pull.ca_file):
        steps.append(Step("upload fleet CA", put=(pull.ca_file, f"{root}/{FLEET_CA}"), root=True))
    wanted_keys = (key_id(parse_public_key(pull.rollout_key)),)
    if facts.watch_config_sha256 != _sha256(files.watch_config) or facts.rollout_keys != wanted_keys:
        cfg = _watch_config(spec, pull)
        argv = [f"{spec.venv}/bin/edgedeploy-agent", "--root", root, "--json", "watch-config", "--broker", cfg.broker]
        argv += ["--registry", cfg.registry_url, "--password-file", str(cfg.password_file)]
        argv += ["--rollout-key", pull.rollout_key, *(["--ca-file", cfg.ca_file] if cfg.ca_file else [])]
        # as root, then handed to the service user: ROOT/trust may be the deploying login's (`keys install`)
        own = 'chown -R "$1:$1" "$2/watch.json" "$2/trust/rollout" && chmod -R g+rwX "$2/watch.json" "$2/trust/rollout"'
        steps += [
            Step("configure watch", tuple(argv), root=True),
            Step("hand the watch config to the service user", ("sh", "-c", own, "sh", user, root), root=True),
        ]
    unit_dir = "/etc/systemd/system"
    steps += unit_steps(
        files.units[WATCH_UNIT], f"{unit_dir}/{WATCH_UNIT}", facts.unit_sha256.get(WATCH_UNIT), WATCH_UNIT
    )
    if steps:  # a new config or unit: the watch service starts (again) with it
        steps.append(Step("start pull units", ("systemctl", "restart", WATCH_UNIT), root=True))
    return steps


def broker_password_path(device: str) -> Path:
    return state_dir() / "mqtt-devices" / device


def record_broker_user(device: str, password_file: Path, broker_passwd: Path | None) -> Path:
    """Keep the device's new broker password here (0600); add the user to `broker_passwd` when given (hashed
    by mosquitto_passwd; the password never appears on a command line). Returns where it was kept."""
    kept = broker_password_path(device)
    kept.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    password = password_file.read_text(encoding="utf-8").strip()
    write_atomic(kept, password + "\n", mode=0o600)  # the only copy on this host
    if broker_passwd is not None:
        hashed = mosquitto_passwd_text({device: password}).strip()
        lines = broker_passwd.read_text().splitlines() if broker_passwd.exists() else []
        others = [ln for ln in lines if ln and ln.split(":", 1)[0] != device]
        broker_passwd.write_text("\n".join([*others, hashed]) + "\n")
    return kept
