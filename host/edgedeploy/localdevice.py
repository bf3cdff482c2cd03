"""A device on this machine: a real OpenSSH server on loopback with throw-away keys.

The demo and the integration tests use the same class. It needs Debian's `openssh-server`
(/usr/sbin/sshd); without it the demo falls back to LocalTransport, which has the same semantics.
"""

from __future__ import annotations

import getpass
import json
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
        deadline = time.monotonic() + 30
        last = ""
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError as e:
                last = str(e)
                if self._proc.poll() is not None:
                    raise EdgeDeployError(f"sshd exited at start: {self.log.read_text()[-300:]}") from None
                time.sleep(0.05)
        self.kill()  # leave no sshd behind when the caller gets an error
        raise EdgeDeployError(
            f"sshd did not start listening on {self.host}:{self.port} in 30 s (last connect: {last}); "
            f"log: {self.log.read_text()[-300:]!r}"
        )

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
        _remove_stale_links(self.host_ip)
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

    def set_rate(self, mbit: int | None) -> None:
        """Limit what the host sends the device to `mbit` Mbit/s (a token bucket on the host's end of the veth
        pair; iproute2's `tc`), or lift the limit (None): a field link, not loopback speed. A test that cuts the
        link mid-upload needs the upload to last: at loopback speed 96 MB crossed between two 10 ms polls."""
        if mbit is None:
            subprocess.run(["tc", "qdisc", "del", "dev", self.outer, "root"], capture_output=True)  # none: fine
            return
        cmd = ["tc", "qdisc", "replace", "dev", self.outer, "root", "tbf", "rate", f"{mbit}mbit"]
        r = subprocess.run([*cmd, "burst", "256kb", "latency", "500ms"], capture_output=True, text=True)
        if r.returncode != 0:
            raise EdgeDeployError(f"`{' '.join(cmd)}` failed: {r.stderr.strip()}")

    def down_all(self) -> None:
        """Remove the namespace and the veth pair (idempotent)."""
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def _remove_stale_links(host_ip: str) -> None:
    """Delete links left in this namespace by a killed run that hold `host_ip`'s /24 (their route would win).

    A run killed mid-test (SIGKILL skips every `finally`) leaves its veth and namespace behind under its own
    tag; the next run's `10.77.N.2` then routes into the dead namespace and nothing there listens (CI failed
    that way on a machine a killed `make test` had used). A link is stale when its peer namespace runs no
    process; one in use by a live run is an error, named, not taken over.
    """
    subnet = host_ip.rsplit(".", 1)[0] + ".0/24"
    r = subprocess.run(["ip", "-4", "-o", "addr", "show", "to", subnet], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        dev = line.split()[1].split("@")[0]
        ns = _veth_peer_netns(dev)
        if ns is not None and subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout:
            raise EdgeDeployError(f"{subnet} is in use by {dev} (namespace {ns} runs processes): another test run?")
        subprocess.run(["ip", "link", "del", dev], capture_output=True)
        if ns is not None:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _veth_peer_netns(dev: str) -> str | None:
    """The named namespace holding the other end of veth `dev`, if any."""
    r = subprocess.run(["ip", "-j", "link", "show", "dev", dev], capture_output=True, text=True)
    try:
        nsid = json.loads(r.stdout)[0].get("link_netnsid")
    except (ValueError, IndexError):
        return None
    if nsid is None:
        return None
    for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines():
        name, _, rest = line.partition(" ")
        if f"(id: {nsid})" in rest:
            return name
    return None
