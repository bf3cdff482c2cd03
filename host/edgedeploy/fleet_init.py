"""`edgedeploy fleet-servers init DIR`: a pilot fleet's registry and MQTT broker on one host, ready to start.

The configuration files are the ones the tests run (fleet_servers.py: write_broker_files, registry_config,
htpasswd_text); this adds their layout, generated passwords, systemd units and the controller's fleet.toml:

    DIR/mosquitto/   mosquitto.conf; passwd (the devices' users: `agent install --broker-passwd DIR/mosquitto/passwd`
                     adds each), passwd-controller, acl, acl-controller; the broker's persistence and log
    DIR/registry/    origin.yml (takes pushes: user `publisher`, htpasswd), readonly.yml (the origin's storage
                     again, read-only, no accounts), cache.yml (a pull-through cache of the read-only endpoint:
                     what devices pull from), htpasswd; data/ (the origin's storage), cache/ (the cache's)
    DIR/controller/  publisher-password, controller-password (plain: the registry push account's and the
                     controller's broker account's), fleet.toml (also CONFIG/fleet.toml, unless one exists)
    DIR/systemd/     edgedeploy-mosquitto.service, edgedeploy-registry-{origin,readonly,cache}.service

The servers run as one account (`user`; default: whoever runs init), which owns mosquitto/ and registry/;
controller/ stays with whoever ran init. Passwords come from `secrets`, their files are 0600, and nothing
prints them. What devices reach (the devices' MQTT listener, the cache) listens on `listen`; the controller's
listener, the origin and the read-only endpoint on loopback (publish and rollout run on this host).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import re
import secrets
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path

from edgedeploy_agent.unit import exec_command, unit_word

from .errors import InputError
from .fleet_servers import (
    CONTROLLER,
    MOSQUITTO,
    REGISTRY,
    MqttListener,
    htpasswd_text,
    registry_config,
    write_broker_files,
    write_secret,
)
from .remote.mqtt import FleetConfig, MqttSettings, RolloutSettings, fleet_config_path, fleet_toml
from .userfiles import write_text_atomic

PUBLISHER = "publisher"  # the registry account that pushes (`edgedeploy publish --user publisher`)
LOOPBACK = "127.0.0.1"
# what mosquitto.conf, the registry's YAML and a unit line all take as they are
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9/._+-]*")
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}")  # what a device's `watch-config --broker HOST:PORT` accepts


@dataclass(frozen=True)
class Ports:
    mqtt: int = 1883  # the devices' listener
    controller: int = 1884  # the controller's listener
    origin: int = 5000
    readonly: int = 5001
    cache: int = 5002


@dataclass(frozen=True)
class FleetServer:
    name: str
    unit: str  # its systemd unit, in DIR/systemd/
    argv: list[str]  # the same server in the foreground
    listen: list[str]  # HOST:PORT
    role: str
    after: list[str] = field(default_factory=list)  # units it needs running first


@dataclass(frozen=True)
class FleetSetup:
    directory: str
    user: str  # the account the servers run as
    servers: list[FleetServer]
    publisher_password_file: str  # the registry account `publisher` (0600)
    controller_password_file: str  # the broker account `controller` (0600)
    fleet_toml: str  # this set-up's controller configuration
    fleet_toml_installed: str | None  # CONFIG/fleet.toml when init wrote it; None: one existed, left as it was
    broker_passwd: str  # the devices' password file (`agent install --broker-passwd`)
    device_broker: str  # HOST:PORT devices connect to (`agent install --mqtt`)
    device_registry: str  # the URL devices pull from (`agent install --registry`)
    publish_registry: str  # HOST:PORT `edgedeploy publish --registry` pushes to
    rollout_key: str


def init_fleet_servers(
    directory: Path,
    *,
    listen: str = "0.0.0.0",
    public_host: str | None = None,
    ports: Ports = Ports(),
    user: str | None = None,
    rollout_key: str = "rollout-1",
) -> FleetSetup:
    """Write the set-up into `directory` (new or empty; init never overwrites one, whose passwords are in use).
    A failure half-way removes what it wrote, so that the next try finds the folder empty again."""
    account = _service_account(user)
    _check_addresses(listen, public_host, ports)
    root = _new_folder(directory)
    public = public_host or (socket.getfqdn() if ipaddress.IPv4Address(listen).is_unspecified else listen)
    try:
        return _write(root, account, listen, public, ports, rollout_key)
    except BaseException:
        for p in root.iterdir():
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink()
        raise


def _write(
    root: Path, account: pwd.struct_passwd, listen: str, public: str, ports: Ports, rollout_key: str
) -> FleetSetup:
    mq, reg, ctl, units = root / "mosquitto", root / "registry", root / "controller", root / "systemd"
    for d in (mq, reg, ctl):
        d.mkdir(mode=0o700)
    units.mkdir()

    publisher_password, controller_password = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    listeners = [MqttListener(listen, ports.mqtt), MqttListener(LOOPBACK, ports.controller, controller=True)]
    broker_config = write_broker_files(mq, {}, controller_password, listeners, user=account.pw_name)
    htpasswd = reg / "htpasswd"
    write_secret(htpasswd, htpasswd_text({PUBLISHER: publisher_password}))
    readonly_url = f"http://{LOOPBACK}:{ports.readonly}"
    registries = {
        "origin": (f"{LOOPBACK}:{ports.origin}", "takes pushes (user publisher)"),
        "readonly": (f"{LOOPBACK}:{ports.readonly}", "the origin's storage, read-only, no accounts"),
        "cache": (f"{listen}:{ports.cache}", "pull-through cache of the read-only endpoint: devices pull here"),
    }
    configs = {
        "origin": registry_config(registries["origin"][0], reg / "data", htpasswd=htpasswd),
        "readonly": registry_config(registries["readonly"][0], reg / "data", read_only=True),
        "cache": registry_config(registries["cache"][0], reg / "cache", upstream=readonly_url),
    }
    servers = [
        FleetServer(
            "mosquitto", "edgedeploy-mosquitto.service", [_binary(MOSQUITTO, "/usr/sbin"), "-c", str(broker_config)],
            [f"{listen}:{ports.mqtt}", f"{LOOPBACK}:{ports.controller}"], "MQTT: devices' and controller's listeners",
        ),
    ]  # fmt: skip
    for name, text in configs.items():
        (reg / f"{name}.yml").write_text(text)
        argv = [_binary(REGISTRY, "/usr/bin"), "serve", str(reg / f"{name}.yml")]
        address, role = registries[name]
        # a cache whose upstream does not answer at start exits (distribution 2.8): after it, restarted till then
        after = ["edgedeploy-registry-readonly.service"] if name == "cache" else []
        unit = f"edgedeploy-registry-{name}.service"
        servers.append(FleetServer(f"registry-{name}", unit, argv, [address], role, after))
    for server in servers:
        (units / server.unit).write_text(server_unit(server, account.pw_name, root))

    publisher_file, controller_file = ctl / "publisher-password", ctl / "controller-password"
    write_secret(publisher_file, publisher_password + "\n")
    write_secret(controller_file, controller_password + "\n")
    controller = f"{LOOPBACK}:{ports.controller}"
    mqtt = MqttSettings(broker=controller, username=CONTROLLER, password_file=str(controller_file))
    toml = fleet_toml(FleetConfig(mqtt=mqtt, rollout=RolloutSettings(key=rollout_key)))
    (ctl / "fleet.toml").write_text(toml)
    if os.geteuid() == 0 and account.pw_uid != 0:
        for d in (mq, reg):
            _chown_tree(d, account)
    config = fleet_config_path()
    installed = not config.exists()  # else the user's own: left as it is
    if installed:  # the last step: nothing after it can fail and leave it naming removed files
        write_text_atomic(config, toml, "controller configuration")
    return FleetSetup(
        directory=str(root), user=account.pw_name, servers=servers,
        publisher_password_file=str(publisher_file), controller_password_file=str(controller_file),
        fleet_toml=str(ctl / "fleet.toml"), fleet_toml_installed=str(config) if installed else None,
        broker_passwd=str(mq / "passwd"), device_broker=f"{public}:{ports.mqtt}",
        device_registry=f"http://{public}:{ports.cache}", publish_registry=registries["origin"][0],
        rollout_key=rollout_key,
    )  # fmt: skip


def server_unit(server: FleetServer, user: str, directory: Path) -> str:
    """A systemd unit for one server: as `user`, writing only under `directory`; mosquitto tells systemd when it
    is ready (Debian builds it with sd_notify) and rereads its password files on `systemctl reload`."""
    broker = server.name == "mosquitto"
    lines = [
        "[Unit]",
        f"Description=edgedeploy pilot fleet: {server.name} ({server.role})",
        "Documentation=https://github.com/edgedeploy/edgedeploy/blob/main/docs/fleet.md",
        f"Wants={' '.join(['network-online.target', *server.after])}",
        f"After={' '.join(['network-online.target', *server.after])}",
        "",
        "[Service]",
        *(["Type=notify", "NotifyAccess=main"] if broker else ["Type=simple"]),
        f"ExecStart={exec_command(server.argv)}",
        *(["ExecReload=/bin/kill -HUP $MAINPID"] if broker else []),
        "Restart=on-failure",
        "RestartSec=5",
        f"User={unit_word(user, 'service user')}",
        f"ReadWritePaths={unit_word(str(directory), 'folder')}",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateDevices=yes",
        "ProtectKernelTunables=yes",
        "ProtectKernelModules=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return "\n".join(lines) + "\n"


def _service_account(user: str | None) -> pwd.struct_passwd:
    euid = os.geteuid()
    if user is None:
        if euid == 0:
            raise InputError(
                "the servers would run as root: give --user NAME, the account they run as",
                hint="a service account: sudo useradd --system --user-group edgedeploy-fleet",
            )
        return pwd.getpwuid(euid)
    try:
        account = pwd.getpwnam(user)
    except KeyError:
        raise InputError(f"--user {user}: no such user on this host") from None
    if account.pw_uid != euid and euid != 0:
        raise InputError(
            f"--user {user}: only root can hand the servers' files to another user",
            hint=f"run init as {user} or as root, or leave --user out: the servers then run as you",
        )
    return account


def _check_addresses(listen: str, public_host: str | None, ports: Ports) -> None:
    try:
        ipaddress.IPv4Address(listen)
    except ValueError:
        raise InputError(f"--listen {listen!r} is not an IPv4 address", hint="0.0.0.0 (every interface)") from None
    if public_host is not None and not _HOST.fullmatch(public_host):
        raise InputError(f"--public-host {public_host!r} is not a host name or an IPv4 address")
    numbers = list(vars(ports).values())
    if len(set(numbers)) != len(numbers):
        raise InputError(f"the five ports must differ, got {', '.join(map(str, numbers))}")


def _new_folder(directory: Path) -> Path:
    root = directory.expanduser().absolute()
    if not _PLAIN_PATH.fullmatch(str(root)):
        raise InputError(
            f"{root}: the servers' configuration files cannot carry this path (spaces, quotes, ...)",
            hint="choose a path of letters, digits and / . _ + -",
        )
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InputError(
            f"{root} is not an empty folder: init makes new passwords and never overwrites a set-up",
            hint="choose a new folder",
        )
    root.mkdir(parents=True, exist_ok=True)
    return root


def _binary(name: str, debian_dir: str) -> str:
    """Where the server's program is (Debian's place when PATH lacks it: /usr/sbin is not on a user's PATH)."""
    return shutil.which(name) or f"{debian_dir}/{name}"


def _chown_tree(top: Path, account: pwd.struct_passwd) -> None:
    for d, _, names in os.walk(top):
        for p in [Path(d), *(Path(d) / n for n in names)]:
            os.chown(p, account.pw_uid, account.pw_gid)
