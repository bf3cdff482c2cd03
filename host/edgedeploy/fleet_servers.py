"""The two pull-fleet servers on this machine: an OCI registry (CNCF distribution) and a mosquitto broker.

Tests, the benchmark and a pilot fleet start the same Debian packages the same way: `docker-registry
serve CONFIG` (an origin that takes pushes with htpasswd auth, and a pull-through cache in front of it
that refuses pushes: the devices' read-only endpoint) and `mosquitto -c CONFIG` (a devices' listener with
one user per device, the client id bound to the user, an ACL that lets a device read only its own desired
topic and write only its own status topic; a controller's listener where the controller writes desired state;
optionally TLS listeners with a fleet CA). Each is stopped by its PID.
"""

from __future__ import annotations

import datetime as dt
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .errors import EdgeDeployError
from .localdevice import free_port

REGISTRY = "docker-registry"
MOSQUITTO = "mosquitto"
CONTROLLER = "controller"


def servers_available() -> str | None:
    """None when both servers are installed, else what is missing."""
    missing = [b for b in (REGISTRY, MOSQUITTO, "mosquitto_passwd") if shutil.which(b) is None]
    return f"not installed: {', '.join(missing)} (apt-get install docker-registry mosquitto)" if missing else None


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
        lines = [
            "version: 0.1",
            "log: {level: warn, accesslog: {disabled: false}}",
            "storage:",
            "  cache: {blobdescriptor: inmemory}",
            f"  filesystem: {{rootdirectory: {(self.read_only_of or self).base / 'data'}}}",
            "  delete: {enabled: true}",
            f"http: {{addr: '{self.address}'}}",
        ]
        if self.users:
            import bcrypt

            htpasswd = self.base / "htpasswd"
            htpasswd.write_text(
                "".join(f"{u}:{bcrypt.hashpw(p.encode(), bcrypt.gensalt(5)).decode()}\n" for u, p in self.users.items())
            )
            lines.append(f"auth: {{htpasswd: {{realm: edgedeploy, path: {htpasswd}}}}}")
        if self.upstream:
            lines.append(f"proxy: {{remoteurl: '{self.upstream}'}}")
        if self.read_only_of:  # the same storage as the origin, served read-only and without accounts
            lines.insert(lines.index("  delete: {enabled: true}") + 1, "  maintenance: {readonly: {enabled: true}}")
        self.config.write_text("\n".join(lines) + "\n")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [REGISTRY, "serve", str(self.config)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        _wait_port(self.host, self.port, self.proc, self.log)
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
        """Two listeners, each with its own accounts (`per_listener_settings true`): devices on `port` (and
        `tls_port`), where `use_username_as_clientid true` makes every session's client id its user name, so one
        device's password cannot connect as another device's client id and take over (disconnect) its session;
        the controller on `controller_port` (and `controller_tls_port`), where client ids are free (several
        controllers at once: `status` while a `rollout` runs) and no device account exists. One broker behind
        both: retained messages and sessions are shared."""
        devices_pw, controller_pw = self.base / "passwd", self.base / "passwd-controller"
        devices_pw.write_text("".join(f"{u}:{p}\n" for u, p in self.devices.items()))
        controller_pw.write_text(f"{CONTROLLER}:{self.controller_password}\n")
        for passwd in (devices_pw, controller_pw):
            subprocess.run(["mosquitto_passwd", "-U", str(passwd)], check=True, capture_output=True)
        devices_acl, controller_acl = self.base / "acl", self.base / "acl-controller"
        devices_acl.write_text("pattern read edgedeploy/v1/desired/%u\npattern readwrite edgedeploy/v1/status/%u\n")
        controller_acl.write_text(f"user {CONTROLLER}\ntopic readwrite edgedeploy/#\n")
        device_settings = [
            "allow_anonymous false",
            "use_username_as_clientid true",
            f"password_file {devices_pw}",
            f"acl_file {devices_acl}",
        ]
        controller_settings = ["allow_anonymous false", f"password_file {controller_pw}", f"acl_file {controller_acl}"]
        lines = [
            "per_listener_settings true",
            "persistence true",
            f"persistence_location {self.base}/",
            "max_connections -1",
            "max_queued_messages 10000",
            f"log_dest file {self.log}",
            f"listener {self.port} {self.host}",
            *device_settings,
            f"listener {self.controller_port} {self.host}",
            *controller_settings,
        ]
        if self.tls_port and self.controller_tls_port:
            self.ca_file = _fleet_ca(self.base, self.host)
            tls = [
                f"cafile {self.ca_file}",
                f"certfile {self.base / 'server.crt'}",
                f"keyfile {self.base / 'server.key'}",
                "tls_version tlsv1.2",
            ]
            lines += [f"listener {self.tls_port} {self.host}", *device_settings, *tls]
            lines += [f"listener {self.controller_tls_port} {self.host}", *controller_settings, *tls]
        self.config.write_text("\n".join(lines) + "\n")
        if os.geteuid() == 0:
            pw = pwd.getpwnam("mosquitto")
            for p in [self.base, *self.base.iterdir()]:
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def start(self) -> LocalBroker:
        if not self.config.exists():
            self._write()
        self.log.touch()
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        _wait_port(self.host, self.port, self.proc, self.log)
        _wait_port(self.host, self.controller_port, self.proc, self.log)
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
