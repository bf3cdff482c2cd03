"""SshTransport: the only module that imports paramiko. Host keys are always verified.

Connections load the fleet's own known_hosts (next to the inventory) and use RejectPolicy: an unknown
or changed key is refused. The only place a key is learned is `enroll_host_key`, behind the explicit
`edgedeploy devices enroll` command, which shows the fingerprint and can check it against one the
technician read off the device.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import shlex
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import paramiko

from edgedeploy_agent.durable import write_atomic

from ..errors import ConnectionFailed, HostKeyError
from ..inventory import Device
from .transport import CommandResult, Progress, Sink

# paramiko logs full tracebacks for dead hosts ("Error reading SSH protocol banner"); we report them ourselves.
logging.getLogger("paramiko").setLevel(logging.CRITICAL)

_CHUNK = 1 << 20


def known_hosts_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def fetch_host_key(host: str, port: int, timeout: float = 10.0) -> paramiko.PKey:
    """Read the server's host key without authenticating (for enrolment only)."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise ConnectionFailed(f"cannot reach {host}:{port}: {e.strerror or e}") from None
    t = paramiko.Transport(sock)
    try:
        t.banner_timeout = timeout
        t.start_client(timeout=timeout)
        return t.get_remote_server_key()
    except (paramiko.SSHException, EOFError, OSError) as e:
        raise ConnectionFailed(f"{host}:{port} did not complete an SSH handshake: {e}") from None
    finally:
        t.close()


def pin_host_key(known_hosts: Path, host: str, port: int, key: paramiko.PKey) -> None:
    """Replace any pinned keys for host:port with `key` in the fleet's known_hosts."""
    entry = known_hosts_entry(host, port)
    keys = paramiko.HostKeys()
    if known_hosts.exists():
        keys.load(str(known_hosts))
    if entry in keys:
        del keys[entry]
    keys.add(entry, key.get_name(), key)
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    tmp = known_hosts.with_name(known_hosts.name + ".new")
    keys.save(str(tmp))  # paramiko writes only to a path: read it back into the one durable write
    write_atomic(known_hosts, tmp.read_bytes())
    tmp.unlink()


def pinned_fingerprint(known_hosts: Path, host: str, port: int) -> str | None:
    if not known_hosts.exists():
        return None
    keys = paramiko.HostKeys(str(known_hosts))
    found = keys.lookup(known_hosts_entry(host, port))
    if not found:
        return None
    return fingerprint(next(iter(found.values())))


class SshTransport:
    name = "ssh"

    def __init__(
        self, device: Device, known_hosts: Path, connect_timeout: float = 10.0, io_timeout: float = 30.0
    ) -> None:
        self.device, self.io_timeout = device, io_timeout
        client = paramiko.SSHClient()
        if known_hosts.exists():
            client.load_host_keys(str(known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        key_file = os.path.expanduser(device.key_file) if device.key_file else None
        if key_file and not Path(key_file).is_file():
            raise ConnectionFailed(f"{device.name}: key file {key_file} does not exist")
        where = f"{device.name} ({device.address})"
        try:
            client.connect(
                device.host,
                port=device.port,
                username=device.user,
                key_filename=key_file,
                timeout=connect_timeout,
                banner_timeout=connect_timeout,
                auth_timeout=connect_timeout,
                allow_agent=False,
                look_for_keys=key_file is None,
            )
        except paramiko.BadHostKeyException as e:
            raise HostKeyError(
                f"{where}: HOST KEY CHANGED: pinned {fingerprint(e.expected_key)}, "
                f"device offers {fingerprint(e.key)}; refusing to connect",
                hint="if the device was reinstalled, check the new fingerprint on its console, then run "
                f"`edgedeploy devices enroll {device.name} --replace`",
            ) from None
        except paramiko.AuthenticationException:
            raise ConnectionFailed(f"{where}: authentication failed (key {key_file or 'default keys'})") from None
        except paramiko.SSHException as e:
            if "not found in known_hosts" in str(e):
                raise HostKeyError(
                    f"{where}: host key is not pinned; refusing to connect",
                    hint=f"run `edgedeploy devices enroll {device.name}` and compare the fingerprint",
                ) from None
            raise ConnectionFailed(f"{where}: SSH failed: {e}") from None
        except TimeoutError:
            raise ConnectionFailed(f"{where}: timed out after {connect_timeout:.0f} s") from None
        except OSError as e:
            raise ConnectionFailed(f"{where}: unreachable ({e.strerror or e})") from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(15)
        self._client = client
        self._sftp: paramiko.SFTPClient | None = None  # one SFTP session for all uploads of a push

    def _sftp_session(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self._client.open_sftp()
            # a link that goes down mid-upload must end the upload, not hang it: the next push resumes
            self._sftp.get_channel().settimeout(self.io_timeout)
        return self._sftp

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        command = shlex.join(argv)
        try:
            transport = self._client.get_transport()
            if transport is None:
                raise paramiko.SSHException("not connected")
            chan = transport.open_session()
            chan.settimeout(timeout)
            chan.exec_command(command)
            out, err = bytearray(), bytearray()
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                if chan.recv_ready():
                    out += chan.recv(_CHUNK)
                elif chan.recv_stderr_ready():
                    err += chan.recv_stderr(_CHUNK)
                elif chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                else:
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError
                    time.sleep(0.005)
            code = chan.recv_exit_status()
            chan.close()
            # no exit status: the command was killed by a signal (sshd sends exit-signal, which paramiko
            # does not read), or sshd or the link went away. Only a fresh channel tells which.
            if code == -1 and not self._link_up():
                raise paramiko.SSHException("the session closed before the command finished")
        except TimeoutError:
            raise ConnectionFailed(
                f"{self.device.name}: `{shlex.join(argv)[:120]}` timed out after {timeout} s"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise ConnectionFailed(
                f"{self.device.name}: connection lost while running {os.path.basename(argv[0])} ({e})",
                hint="the device completes or undoes an interrupted deploy by itself at the next contact; "
                f"check with `edgedeploy devices facts {self.device.name}`",
            ) from None
        return CommandResult(tuple(argv), code, out.decode(errors="replace"), err.decode(errors="replace"))

    def stream(self, argv: Sequence[str], out: Sink, err: Sink) -> int:
        """Run `argv`, handing its output over as it arrives; returns its exit status.

        While the command is silent the link is probed every `io_timeout` s (a fresh channel must open
        within `io_timeout`), so a dropped link ends the stream with ConnectionFailed instead of a hang.
        Ctrl-C closes the channel: the device's side sees its session end.
        """
        chan = None
        try:
            transport = self._client.get_transport()
            if transport is None:
                raise paramiko.SSHException("not connected")
            chan = transport.open_session(timeout=self.io_timeout)
            chan.exec_command(shlex.join(argv))
            quiet_since = time.monotonic()
            while True:
                if chan.recv_ready():
                    out(chan.recv(_CHUNK))
                elif chan.recv_stderr_ready():
                    err(chan.recv_stderr(_CHUNK))
                elif chan.exit_status_ready():
                    break
                else:
                    if time.monotonic() - quiet_since > self.io_timeout:
                        if not self._link_up():
                            raise paramiko.SSHException("the device stopped answering")
                        quiet_since = time.monotonic()
                    time.sleep(0.02)
                    continue
                quiet_since = time.monotonic()
            code = int(chan.recv_exit_status())
            if code == -1 and not self._link_up():
                raise paramiko.SSHException("the session closed before the command finished")
            return code
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise ConnectionFailed(
                f"{self.device.name}: connection lost while running {os.path.basename(argv[0])} ({e})",
                hint="check the device's network link, then run the command again",
            ) from None
        finally:
            if chan is not None:
                chan.close()

    def _link_up(self) -> bool:
        """Open (and close) a session: it succeeds only when the link and sshd are still there."""
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            return False
        try:
            transport.open_session(timeout=self.io_timeout).close()
        except (paramiko.SSHException, OSError, EOFError):
            return False
        return True

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        """SFTP upload to REMOTE.part, resuming a partial upload, then an atomic rename."""
        part = remote + ".part"
        total = local.stat().st_size
        last = [time.monotonic()]
        done_event = threading.Event()

        def watchdog() -> None:
            # paramiko can block past its channel timeout when a link dies mid-write (seen in CI-like
            # runs): with no progress for io_timeout, close the raw socket so every blocked call fails
            while not done_event.wait(0.5):
                if time.monotonic() - last[0] > self.io_timeout:
                    transport = self._client.get_transport()
                    if transport is not None:
                        transport.sock.close()
                    return

        guard = threading.Thread(target=watchdog, name=f"upload-watchdog-{self.device.name}", daemon=True)
        guard.start()
        try:
            sftp = self._sftp_session()
            try:
                offset = sftp.stat(part).st_size or 0
            except FileNotFoundError:
                offset = 0
            if offset > total:
                offset = 0
            with open(local, "rb") as src, sftp.open(part, "ab" if offset else "wb") as dst:
                dst.set_pipelined(True)
                src.seek(offset)
                done = offset
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
                    done += len(chunk)
                    last[0] = time.monotonic()
                    if progress:
                        progress(done, total)
            sftp.posix_rename(part, remote)
        except (paramiko.SSHException, OSError, EOFError) as e:
            self._sftp = None
            self._client.close()  # the session is unusable after a timeout mid-write
            raise ConnectionFailed(
                f"{self.device.name}: upload of {local.name} failed ({e or type(e).__name__})",
                hint="run the push again: the upload resumes where it stopped",
            ) from None
        finally:
            done_event.set()

    def close(self) -> None:
        if self._sftp is not None:
            self._sftp.close()
            self._sftp = None
        self._client.close()
