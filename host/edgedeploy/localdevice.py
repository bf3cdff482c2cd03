"""A device on this machine: a real OpenSSH server on loopback with throw-away keys.

The demo and the integration tests use the same class. It needs Debian's `openssh-server`
(/usr/sbin/sshd); without it the demo falls back to LocalTransport, which has the same semantics.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .errors import EdgeDeployError

SSHD = "/usr/sbin/sshd"


def sshd_available() -> bool:
    return Path(SSHD).is_file() and shutil.which("ssh-keygen") is not None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LoopbackSshd:
    """sshd on 127.0.0.1:<free port>, accepting one client key, as the current user."""

    def __init__(self, base: Path, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.base, self.host, self.port = base, host, port or free_port(host)
        self.user = getpass.getuser()
        self.host_key = base / "host_ed25519"
        self.client_key = base / "client_ed25519"
        self.config = base / "sshd_config"
        self.pidfile = base / "sshd.pid"
        self.log = base / "sshd.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def _keygen(self, path: Path) -> None:
        if not path.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)

    def start(self) -> LoopbackSshd:
        if not sshd_available():
            raise EdgeDeployError(f"{SSHD} is not installed", hint="apt-get install openssh-server")
        self.base.mkdir(parents=True, exist_ok=True)
        os.chmod(self.base, 0o700)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation dir
        self._keygen(self.host_key)
        self._keygen(self.client_key)
        auth = self.base / "authorized_keys"
        auth.write_text(self.client_key.with_suffix(".pub").read_text())
        os.chmod(auth, 0o600)
        self.config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.host}",
                    f"Port {self.port}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.pidfile}",
                    f"AuthorizedKeysFile {auth}",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    "AllowAgentForwarding no",
                    "AllowTcpForwarding no",
                    "X11Forwarding no",
                    "Subsystem sftp internal-sftp",
                    "MaxStartups 50",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        subprocess.run([SSHD, "-t", "-f", str(self.config)], check=True, capture_output=True)
        # -D: stay in the foreground so we own the process; -e: log to stderr (our log file)
        log = open(self.log, "ab")
        self._proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                if self._proc.poll() is not None:
                    raise EdgeDeployError(f"sshd exited at start: {self.log.read_text()[-300:]}") from None
                time.sleep(0.05)
        raise EdgeDeployError(f"sshd did not start listening on {self.host}:{self.port}")

    def stop(self) -> None:
        if self._proc and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def __enter__(self) -> LoopbackSshd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
