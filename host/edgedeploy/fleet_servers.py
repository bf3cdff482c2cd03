"""The two pull-fleet servers: an OCI registry (CNCF distribution) and a mosquitto broker.

Their configuration is rendered here, once, for everybody who runs them: tests and the benchmark (LocalRegistry,
LocalBroker start them on loopback) and a pilot fleet (`edgedeploy fleet-servers init`, fleet_init.py, writes the
same files plus systemd units). Both run the Debian packages: `docker-registry serve CONFIG` (an origin that
takes pushes with htpasswd auth; a read-only endpoint on the origin's storage; a pull-through cache in front of
that, which refuses pushes: the devices' endpoint) and `mosquitto -c CONFIG` (a devices' listener with one user
per device, the client id bound to the user, an ACL that lets a device read only its own desired topic and write
only its own status topic; a controller's listener where the controller writes desired state; optionally TLS
listeners with a fleet CA). Each process is stopped by its PID.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgedeploy_agent.desired import TOPIC_ROOT
from edgedeploy_agent.durable import write_atomic

from .errors import EdgeDeployError, InputError
from .localdevice import free_port

REGISTRY = "docker-registry"
MOSQUITTO = "mosquitto"
CONTROLLER = "controller"


def servers_available() -> str | None:
    """None when both servers are installed, else what is missing."""
    missing = [b for b in (REGISTRY, MOSQUITTO, "mosquitto_passwd") if shutil.which(b) is None]
    return f"not installed: {', '.join(missing)} (apt-get install docker-registry mosquitto)" if missing else None


# --- the configuration files, rendered in one place ---------------------------------------------------------


def write_secret(path: Path, text: str) -> None:
    """A password file (plain or hashed): mode 0600 from its first byte."""
    write_atomic(path, text, mode=0o600)


def htpasswd_text(users: dict[str, str]) -> str:
    """The registry's htpasswd file: bcrypt, the only scheme distribution's htpasswd auth accepts (Debian's
    packages bring no `htpasswd` tool). Cost 5, `htpasswd -B`'s default: the registry checks the hash on every
    request of a push, and edgedeploy's own passwords are random (`secrets`), so a higher cost guards nothing."""
    import bcrypt

    return "".join(f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(5)).decode()}\n" for u, p in users.items())


def registry_config(
    address: str, storage: Path, *, htpasswd: Path | None = None, upstream: str | None = None, read_only: bool = False
) -> str:
    """One `docker-registry serve` configuration (distribution 2.8): listening on HOST:PORT `address`, blobs under
    `storage`; accounts from `htpasswd` (an origin), a pull-through cache of `upstream`, or `read_only` (the
    origin's storage served again without accounts: distribution's proxy cannot log in to an upstream). Values
    are written as JSON strings, which YAML reads as they are (a path with `:` or `#` included)."""
    q = json.dumps
    lines = [
        "version: 0.1",
        "log: {level: warn, accesslog: {disabled: false}}",
        "storage:",
        "  cache: {blobdescriptor: inmemory}",
        f"  filesystem: {{rootdirectory: {q(str(storage))}}}",
        "  delete: {enabled: true}",
    ]
    if read_only:
        lines.append("  maintenance: {readonly: {enabled: true}}")
    lines.append(f"http: {{addr: {q(address)}}}")
    if htpasswd is not None:
        lines.append(f"auth: {{htpasswd: {{realm: edgedeploy, path: {q(str(htpasswd))}}}}}")
    if upstream:
        lines.append(f"proxy: {{remoteurl: {q(upstream)}}}")
    return "\n".join(lines) + "\n"


def mosquitto_passwd_text(users: dict[str, str]) -> str:
    """`user:hash` lines as mosquitto reads them, hashed by `mosquitto_passwd -U` in a private temp folder: the
    plain passwords are never on a command line and never in the broker's folder."""
    if not users:
        return ""
    with tempfile.TemporaryDirectory(prefix="edgedeploy-mq-") as tmp:
        plain = Path(tmp) / "passwd"
        write_secret(plain, "".join(f"{u}:{p}\n" for u, p in users.items()))
        try:
            subprocess.run(["mosquitto_passwd", "-U", str(plain)], check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise InputError(
                f"mosquitto_passwd could not hash the broker passwords: {e}",
                hint="apt-get install mosquitto (it ships mosquitto_passwd)",
            ) from None
        return plain.read_text()


@dataclass(frozen=True)
class MqttListener:
    """One mosquitto listener: the devices' (one user per device) or the controller's; `tls` takes the fleet CA
    and server certificate in the broker's folder (ca.crt, server.crt, server.key)."""

    host: str
    port: int
    controller: bool = False
    tls: bool = False


def write_broker_files(
    base: Path, devices: dict[str, str], controller_password: str, listeners: Sequence[MqttListener],
    user: str | None = None,
) -> Path:  # fmt: skip
    """mosquitto.conf in `base` and the files it names there (password files hashed and 0600, ACLs); persistence
    and the log go there too. `user`: whom mosquitto started as root runs as (`user` setting; its default is
    `mosquitto`), who must be able to read `base`. Returns the configuration's path.

    Each listener has accounts of its own (`per_listener_settings true`): on the devices' listeners
    `use_username_as_clientid true` makes every session's client id its user name, so one device's password
    cannot connect as another device's client id and take over (disconnect) its session; on the controller's,
    client ids are free (several controllers at once: `status` while a `rollout` runs) and no device account
    exists. One broker behind both: retained messages and sessions are shared."""
    devices_pw, controller_pw = base / "passwd", base / "passwd-controller"
    write_secret(devices_pw, mosquitto_passwd_text(devices))
    write_secret(controller_pw, mosquitto_passwd_text({CONTROLLER: controller_password}))
    devices_acl, controller_acl = base / "acl", base / "acl-controller"
    # a device's own topics and, one level down, those of its model slots besides `default` (desired.py)
    devices_acl.write_text(
        "".join(
            f"pattern read {TOPIC_ROOT}/desired/%u{slot}\npattern readwrite {TOPIC_ROOT}/status/%u{slot}\n"
            for slot in ("", "/+")
        )
    )
    controller_acl.write_text(f"user {CONTROLLER}\ntopic readwrite edgedeploy/#\n")
    lines = [
        "per_listener_settings true",
        *([f"user {user}"] if user else []),
        "persistence true",
        f"persistence_location {base}/",
        "max_connections -1",
        "max_queued_messages 10000",
        f"log_dest file {base / 'mosquitto.log'}",
    ]
    for listener in listeners:
        lines += [f"listener {listener.port} {listener.host}", "allow_anonymous false"]
        if listener.controller:
            lines += [f"password_file {controller_pw}", f"acl_file {controller_acl}"]
        else:
            lines += ["use_username_as_clientid true", f"password_file {devices_pw}", f"acl_file {devices_acl}"]
        if listener.tls:
            lines += [
                f"cafile {base / 'ca.crt'}",
                f"certfile {base / 'server.crt'}",
                f"keyfile {base / 'server.key'}",
                "tls_version tlsv1.2",
            ]
    config = base / "mosquitto.conf"
    config.write_text("\n".join(lines) + "\n")
    return config


# --- the processes ------------------------------------------------------------------------------------------


def _wait_port(host: str, port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise EdgeDeployError(f"{proc.args!r} exited with {proc.returncode}: {log.read_text()[-500:]}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise EdgeDeployError(f"{proc.args!r} did not listen on {host}:{port} within {timeout} s")


class _Server:
    proc: subprocess.Popen[bytes] | None = None
    host = "127.0.0.1"
    port = 0
    log: Path

    def _spawn(self, argv: list[str], listens: Sequence[tuple[str, int]]) -> None:
        """Start `argv` (its output appended to the log) and wait until it listens on every (host, port)."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        for host, port in listens:
            _wait_port(host, port, self.proc, self.log)

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL by PID: a crash, not a shutdown."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ServerProcess(_Server):
    """A server from configuration written beforehand (`fleet-servers init`): `argv` as init prints it, started
    in the foreground way (no systemd), waited for on each HOST:PORT of `listens`."""

    def __init__(self, argv: list[str], listens: list[str], log: Path) -> None:
        self.argv, self.log = argv, log
        self.listens = [(host, int(port)) for host, _, port in (a.rpartition(":") for a in listens)]

    def start(self) -> ServerProcess:
        self._spawn(self.argv, self.listens)
        return self


class LocalRegistry(_Server):
    """`docker-registry serve`: an origin (with htpasswd users, if any), or a pull-through cache of one."""

    def __init__(
        self,
        base: Path,
        users: dict[str, str] | None = None,
        upstream: str | None = None,
        read_only_of: LocalRegistry | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.base, self.users, self.upstream, self.host = base, users or {}, upstream, host
        self.read_only_of = read_only_of
        self.port = free_port(host)
        self.config = base / "registry.yml"
        self.log = base / "registry.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def start(self) -> LocalRegistry:
        self.base.mkdir(parents=True, exist_ok=True)
        htpasswd = self.base / "htpasswd" if self.users else None
        if htpasswd is not None:
            write_secret(htpasswd, htpasswd_text(self.users))
        storage = (self.read_only_of or self).base / "data"
        read_only = self.read_only_of is not None
        config = registry_config(self.address, storage, htpasswd=htpasswd, upstream=self.upstream, read_only=read_only)
        self.config.write_text(config)
        self._spawn([REGISTRY, "serve", str(self.config)], [(self.host, self.port)])
        return self

    def requests(self) -> dict[str, int]:
        """Requests served so far, by method + kind (from the access log)."""
        return self.traffic()[0]

    def traffic(self) -> tuple[dict[str, int], int]:
        """(requests by method + kind, response body bytes) from the access log (combined log format)."""
        counts: dict[str, int] = {}
        sent = 0
        for line in self.log.read_text(errors="replace").splitlines():
            m = re.search(r'"(GET|HEAD|PUT|POST|PATCH|DELETE) (/v2/\S*) [^"]*" (\d{3}) (\d+|-)', line)
            if not m:
                continue
            path = m.group(2)
            kind = "blobs" if "/blobs/" in path else "manifests" if "/manifests/" in path else "other"
            key = f"{m.group(1)} {kind}"
            counts[key] = counts.get(key, 0) + 1
            sent += int(m.group(4)) if m.group(4).isdigit() else 0
        return counts, sent

    def __enter__(self) -> LocalRegistry:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalBroker(_Server):
    """`mosquitto -c`: persistence on, anonymous off, one user per device plus the controller, an ACL."""

    def __init__(self, devices: dict[str, str], controller_password: str, tls: bool = False) -> None:
        self.devices, self.controller_password, self.tls = devices, controller_password, tls
        self.port = free_port()
        self.tls_port = free_port() if tls else None
        self.controller_port = free_port()  # the controller's own listener (_write says why)
        self.controller_tls_port = free_port() if tls else None
        # mosquitto started as root drops to user `mosquitto`, which must read its folder: a folder of its
        # own under /tmp, not inside a root-only test temp dir
        self.base = Path(tempfile.mkdtemp(prefix="edgedeploy-mq-"))
        self.config = self.base / "mosquitto.conf"
        self.log = self.base / "mosquitto.log"
        self.ca_file: Path | None = None

    @property
    def address(self) -> str:
        """Where devices connect."""
        return f"{self.host}:{self.port}"

    @property
    def controller_address(self) -> str:
        """Where the controller (`rollout` / `status --via mqtt`) connects."""
        return f"{self.host}:{self.controller_port}"

    def _write(self) -> None:
        """Two listeners (write_broker_files), two more with TLS and a throw-away fleet CA when `tls`."""
        listeners = [MqttListener(self.host, self.port), MqttListener(self.host, self.controller_port, controller=True)]
        if self.tls_port and self.controller_tls_port:
            self.ca_file = _fleet_ca(self.base, self.host)
            listeners += [
                MqttListener(self.host, self.tls_port, tls=True),
                MqttListener(self.host, self.controller_tls_port, controller=True, tls=True),
            ]
        write_broker_files(self.base, self.devices, self.controller_password, listeners)
        if os.geteuid() == 0:
            pw = pwd.getpwnam("mosquitto")
            for p in [self.base, *self.base.iterdir()]:
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def start(self) -> LocalBroker:
        if not self.config.exists():
            self._write()
        self.log.touch()
        self._spawn([MOSQUITTO, "-c", str(self.config)], [(self.host, self.port), (self.host, self.controller_port)])
        return self

    def rss_kib(self) -> int | None:
        if not self.running or self.proc is None:
            return None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fleet_ca(base: Path, host: str) -> Path:
    """A throw-away fleet CA and a server certificate for `host` (what a real fleet CA would issue)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgedeploy test fleet CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(host))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    (base / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (base / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (base / "server.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return base / "ca.crt"
