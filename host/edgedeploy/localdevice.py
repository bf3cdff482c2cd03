"""A device on this machine: a real OpenSSH server on loopback with throw-away keys.

The demo and the integration tests use the same class. It needs Debian's `openssh-server`
(/usr/sbin/sshd); without it the demo falls back to LocalTransport, which has the same semantics.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
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

    def __init__(self, base: Path, host: str = "127.0.0.1", port: int | None = None, netns: str | None = None) -> None:
        self.base, self.host, self.netns = base, host, netns
        self.port = port or (2222 if netns else free_port(host))
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
        prefix = ["ip", "netns", "exec", self.netns] if self.netns else []
        self._proc = subprocess.Popen(
            [*prefix, SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log, stdin=subprocess.DEVNULL
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

    def kill(self) -> None:
        """Kill sshd and every session it serves (a crashed sshd, a rebooting device)."""
        if self._proc and self._proc.poll() is None:
            for pid in _descendants(self._proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._proc.kill()
            self._proc.wait()
        self._proc = None

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


def _descendants(pid: int) -> list[int]:
    """Child processes of `pid` (sshd's per-connection processes), deepest first; not the agent service."""
    out: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for c in children:
        out += _descendants(int(c))
        out.append(int(c))
    return out


def netns_available() -> tuple[bool, str]:
    """Can this process create network namespaces and veth pairs? (root and iproute2 needed)"""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    if shutil.which("ip") is None:
        return False, "iproute2 (`ip`) is not installed"
    probe = f"edp{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return False, f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return True, ""


class NetnsLink:
    """A network namespace joined to this one by a veth pair: 10.77.N.1 here, 10.77.N.2 inside."""

    def __init__(self, index: int, tag: str = "ed") -> None:
        if not 1 <= index <= 254:
            raise EdgeDeployError(f"netns index {index} out of range 1..254")
        self.index = index
        self.ns = f"{tag}ns{index}"
        self.outer, self.inner = f"{tag}v{index}h", f"{tag}v{index}d"
        self.host_ip, self.device_ip = f"10.77.{index}.1", f"10.77.{index}.2"

    def _ip(self, *args: str, ns: bool = False) -> None:
        cmd = ["ip", "netns", "exec", self.ns, "ip", *args] if ns else ["ip", *args]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise EdgeDeployError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")

    def up(self) -> NetnsLink:
        self.down_all()
        self._ip("netns", "add", self.ns)
        self._ip("link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        self._ip("link", "set", self.inner, "netns", self.ns)
        self._ip("addr", "add", f"{self.host_ip}/24", "dev", self.outer)
        self._ip("link", "set", self.outer, "up")
        self._ip("addr", "add", f"{self.device_ip}/24", "dev", self.inner, ns=True)
        self._ip("link", "set", self.inner, "up", ns=True)
        self._ip("link", "set", "lo", "up", ns=True)
        return self

    def set_link(self, up: bool) -> None:
        """Take the device's link down or up (the fault a field technician meets most)."""
        self._ip("link", "set", self.outer, "up" if up else "down")

    def down_all(self) -> None:
        """Remove the namespace and the veth pair (idempotent)."""
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
