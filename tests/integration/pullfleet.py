"""A pull fleet for tests and bench: a real registry (origin + read-only endpoint + pull-through cache),
a real mosquitto with per-device users, and real `edgedeploy-agent watch` processes on local device roots.
Also a tiny HTTP proxy in front of the registry that injects faults (corrupt bytes, a cut link, no Range)."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from edgedeploy.fleet_servers import CONTROLLER, LocalBroker, LocalRegistry
from edgedeploy.localdevice import free_port
from edgedeploy.remote.mqtt import FleetConfig, MqttSettings, RolloutSettings, fleet_toml
from edgedeploy.signing import generate_key, list_keys
from tests.helpers import BIN, Cli, agent

PUBLISHER = ("publisher", "publisher-secret")


@dataclass
class WatchDevice:
    name: str
    root: Path
    password: str
    proc: subprocess.Popen[bytes] | None = None

    def current(self) -> str | None:
        link = self.root / "models" / "default" / "current"
        return os.readlink(link).split("/")[-1] if link.is_symlink() else None

    def log(self) -> str:
        p = self.root / "watch.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def start(self, agent_command: Path = BIN / "edgedeploy-agent") -> WatchDevice:
        """`edgedeploy-agent watch` for this device (this venv's, or another interpreter's install)."""
        with open(self.root / "watch.log", "ab") as log:
            self.proc = subprocess.Popen(
                [str(agent_command), "--root", str(self.root), "watch"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            self.proc.wait(15)
        self.proc = None

    def close(self) -> None:
        """The watch and the inference agents (one per model slot) stopped: no process left behind."""
        self.stop()
        for slot in sorted({"default", *(p.name for p in (self.root / "models").glob("*"))}):
            agent("--root", str(self.root), "--json", "stop", "--model", slot)


def watch_device(
    root: Path, inventory: Path, source: str, password: str, broker: str, registry: str, tag: str = "lab"
) -> WatchDevice:
    """A device root named after its folder, set up as a pilot device is by hand: initialised, the bundle key
    (fleet-1) pinned, its broker password in a 0600 file, `watch-config` with the rollout key (rollout-1); and
    added to the inventory. Backoff and poll shortened: a test waits seconds, not minutes."""
    dev = WatchDevice(root.name, root, password)
    init = ("init", "--device-name", dev.name, "--service", "process", "--source", source, "--profile", "cpu-x86_64")
    keys = {k.name: k.public for k in list_keys()}
    for args in (init, ("trust", "--set", keys["fleet-1"])):
        r = agent("--root", str(root), *args)
        assert r.code == 0, f"edgedeploy-agent {args[0]}: exit {r.code}\n{r.out}\n{r.err}"
    pw = root / "mqtt-password"
    pw.write_text(password)
    pw.chmod(0o600)
    r = agent(
        "--root", str(root), "watch-config", "--broker", broker, "--registry", registry,
        "--password-file", str(pw), "--rollout-key", keys["rollout-1"],
    )  # fmt: skip
    assert r.code == 0, r.err
    cfg_path = root / "watch.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(backoff_min_s=0.2, backoff_max_s=2.0, poll_s=2.0)
    cfg_path.write_text(json.dumps(cfg))
    with open(inventory, "a") as f:
        f.write(
            f'[devices.{dev.name}]\nhost = "127.0.0.1"\nprofile = "cpu-x86_64"\ntags = ["{tag}"]\n'
            f'root = "{root}"\nservice = "process"\ntransport = "local"\n'
        )
    return dev


@dataclass
class PullFleet:
    base: Path
    cli: Cli
    origin: LocalRegistry
    readonly: LocalRegistry
    cache: LocalRegistry
    broker: LocalBroker
    devices: dict[str, WatchDevice] = field(default_factory=dict)

    @property
    def inventory(self) -> Path:
        return self.base / "devices.toml"

    def args(self) -> list[str]:
        return ["--inventory", str(self.inventory)]

    def setup_host(self, home: Path) -> None:
        """Keys (bundle + rollout), fleet.toml and the inventory, as a pilot fleet's controller has them."""
        for key in ("fleet-1", "rollout-1"):
            generate_key(key)  # in process: `keys generate` has its own tests (test_signed_push.py)
        pw = home / "config" / "mqtt-controller"
        pw.write_text(self.broker.controller_password)
        pw.chmod(0o600)
        mqtt = MqttSettings(broker=self.broker.controller_address, username=CONTROLLER, password_file=str(pw))
        config = FleetConfig(mqtt=mqtt, rollout=RolloutSettings(key="rollout-1", expires_hours=1))
        (home / "config" / "fleet.toml").write_text(fleet_toml(config))

    def add(self, name: str, source: str, tag: str = "lab", endpoint: str | None = None) -> WatchDevice:
        """A device root (watch_device) on this fleet's broker and, unless `endpoint`, its cache."""
        dev = watch_device(
            self.base / name, self.inventory, source, self.broker.devices[name], self.broker.address,
            endpoint or self.cache.url, tag,
        )  # fmt: skip
        self.devices[name] = dev
        return dev

    def start(self, name: str, agent_command: Path = BIN / "edgedeploy-agent") -> WatchDevice:
        return self.devices[name].start(agent_command)

    def stop(self, name: str, kill: bool = False) -> None:
        self.devices[name].stop(kill)

    def close(self) -> None:
        for dev in self.devices.values():
            dev.close()
        for server in (self.cache, self.readonly, self.origin):
            server.stop()
        self.broker.close()


def start_pull_fleet(base: Path, cli: Cli, names: list[str]) -> PullFleet:
    base.mkdir(parents=True, exist_ok=True)
    origin = LocalRegistry(base / "origin", users=dict([PUBLISHER])).start()
    readonly = LocalRegistry(base / "readonly", read_only_of=origin).start()
    cache = LocalRegistry(base / "cache", upstream=readonly.url).start()
    broker = LocalBroker({n: secrets.token_hex(12) for n in names}, secrets.token_hex(12)).start()
    return PullFleet(base, cli, origin, readonly, cache, broker)


class LoopbackHTTP:
    """An HTTP server on 127.0.0.1, serving from a thread while the `with` block runs (a registry written for a
    test: the subclass gives its request handler)."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> LoopbackHTTP:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class FaultProxy(LoopbackHTTP):
    """HTTP proxy in front of a registry endpoint: `corrupt` flips a byte of that blob, `cut_after` closes the
    connection after N body bytes of any blob longer than that (`cuts` counts them), `ignore_range` answers a
    range request with a full 200."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.corrupt: str | None = None
        self.cut_after: int | None = None
        self.ignore_range = False
        self.cuts = 0  # blobs whose link went down mid-body
        self.seen: list[tuple[str, str | None, int]] = []  # (path, Range asked, status answered)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                return None

            def do_GET(self) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("accept", "range")}
                if proxy.ignore_range:
                    headers.pop("Range", None)
                req = urllib.request.Request(proxy.upstream + self.path, headers=headers)
                try:
                    up = urllib.request.urlopen(req, timeout=30)
                except urllib.error.HTTPError as e:
                    up = e
                body = up.read()
                proxy.seen.append((self.path, self.headers.get("Range"), up.status))
                if proxy.corrupt and proxy.corrupt in self.path and body:
                    body = bytes([body[0] ^ 0xFF]) + body[1:]
                self.send_response(up.status)
                for k, v in up.headers.items():
                    if k.lower() in ("content-type", "content-range", "docker-content-digest"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                cut = proxy.cut_after
                if cut is not None and "/blobs/" in self.path and len(body) > cut:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    self.connection.shutdown(2)  # the link goes down mid-blob
                    proxy.cuts += 1
                    return
                self.wfile.write(body)

        super().__init__(Handler)


def signed(cli: Cli, bundle: Path, out: Path) -> Path:
    """`bundle` signed with the fleet's key (fleet-1, made by PullFleet.setup_host)."""
    r = cli("sign", str(bundle), "--key", "fleet-1", "-o", str(out))
    assert r.code == 0, r.err
    return out


def wait_for(check: object, timeout: float = 60.0) -> None:
    """Poll `check()` until it is true; fail after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"not true within {timeout} s")
