"""A pilot fleet from nothing, as docs/fleet.md walks it (issue 35, item 4): `edgedeploy fleet-servers init` writes
mosquitto's and the registry's configuration (the files LocalBroker and LocalRegistry write for every other pull
test), passwords (0600, printed nowhere) and systemd units, which `systemd-analyze verify` passes. The servers
start from those files with the commands init prints (processes on loopback: no systemd here); a device gets its
broker user the way `agent install --broker-passwd` adds it and the broker reloads (SIGHUP, the units'
`systemctl reload`); a bundle published with the generated password reaches the device through `rollout --via
mqtt`. The device's watch logs its connection, the broker's loss and the reconnection; with the registry cache
down, the next rollout fails printing the device's own reason."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgedeploy.fleet_servers import ServerProcess, servers_available
from edgedeploy.localdevice import free_port
from edgedeploy.remote.install_pull import record_broker_user
from edgedeploy_agent.bundle import read_manifest
from tests.helpers import BIN, Cli, assert_one_line_error, require
from tests.integration.conftest import LabeledVideo
from tests.integration.pullfleet import signed, wait_for, watch_device

pytestmark = [pytest.mark.integration, pytest.mark.fleet_servers]


def _user_args() -> list[str]:
    """As root (CI), the servers run as `mosquitto` (init refuses to make root their account); else as you."""
    return ["--user", "mosquitto"] if os.geteuid() == 0 else []


@pytest.fixture
def base() -> Iterator[Path]:
    """A folder every account may enter: the servers' own account must reach DIR (pytest's tmp_path is root's)."""
    d = Path(tempfile.mkdtemp(prefix="edgedeploy-pilot-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _init(cli: Cli, directory: Path, *extra: str) -> dict[str, Any]:
    ports = {f"--{n}-port": str(free_port()) for n in ("mqtt", "controller", "origin", "readonly", "cache")}
    args = [a for kv in ports.items() for a in kv]
    r = cli("fleet-servers", "init", str(directory), "--listen", "127.0.0.1", *args, *_user_args(), *extra)
    assert r.code == 0, r.out + r.err
    return json.loads(r.out) if "--json" in extra else {"out": r.out}


def test_init_writes_private_passwords_and_units_that_verify(cli: Cli, base: Path, hermetic: Path) -> None:
    require("FLEET_SERVERS", servers_available())
    printed = _init(cli, base / "fleet")["out"]
    fleet = base / "fleet"
    secret_files = [
        fleet / "controller" / "publisher-password", fleet / "controller" / "controller-password",
        fleet / "registry" / "htpasswd", fleet / "mosquitto" / "passwd", fleet / "mosquitto" / "passwd-controller",
    ]  # fmt: skip
    for f in secret_files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    for f in secret_files[:2]:
        password = f.read_text().strip()
        assert len(password) >= 32 and password not in printed, f
    assert f"cat {secret_files[0]}" in printed  # where the publisher's password is, for `publish`
    assert "$2b$05$" in (fleet / "registry" / "htpasswd").read_text()  # bcrypt, what distribution's htpasswd reads
    conf = (fleet / "mosquitto" / "mosquitto.conf").read_text()
    assert "use_username_as_clientid true" in conf and "allow_anonymous false" in conf
    assert (hermetic / "config" / "fleet.toml").read_text() == (fleet / "controller" / "fleet.toml").read_text()
    assert "sudo systemctl enable --now edgedeploy-mosquitto edgedeploy-registry-origin" in printed

    analyze = shutil.which("systemd-analyze")
    require("SYSTEMD_ANALYZE", "systemd-analyze not installed (apt-get install systemd)" if analyze is None else None)
    units = sorted((fleet / "systemd").glob("*.service"))
    assert [u.name for u in units] == [
        "edgedeploy-mosquitto.service", "edgedeploy-registry-cache.service",
        "edgedeploy-registry-origin.service", "edgedeploy-registry-readonly.service",
    ]  # fmt: skip
    p = subprocess.run([str(analyze), "verify", *map(str, units)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr

    # a second init leaves the set-up (and its passwords in use) alone; a fleet.toml of the user's is kept
    before = secret_files[0].read_text()
    again = cli("fleet-servers", "init", str(fleet), *_user_args())
    assert_one_line_error(again, 2, "not an empty folder")
    assert secret_files[0].read_text() == before
    other = _init(cli, base / "other")["out"]
    assert "your fleet.toml exists and was left as it is" in other
    assert str(base / "other") not in (hermetic / "config" / "fleet.toml").read_text()

    for args, says in [
        (["--listen", "nowhere"], "--listen"),
        (["--mqtt-port", "0"], "--mqtt-port"),
        (["--origin-port", "1883"], "ports must differ"),  # the devices' MQTT port by default
        (["--public-host", "cam host"], "--public-host"),
    ]:
        assert_one_line_error(cli("fleet-servers", "init", str(base / "x"), *args, *_user_args()), 2, says)
    assert_one_line_error(cli("fleet-servers", "init", str(base / "a b"), *_user_args()), 2, "cannot carry this path")
    assert_one_line_error(cli("fleet-servers", "init", str(base / "x"), "--user", "no-such-user-here"), 2, "no such")
    if os.geteuid() == 0:
        assert_one_line_error(cli("fleet-servers", "init", str(base / "x")), 2, "would run as root")
    assert not (base / "x").exists()
    # no mosquitto_passwd on PATH: one line, and the folder is left empty for the next try
    r = cli("fleet-servers", "init", str(base / "y"), *_user_args(), env={"PATH": str(BIN)})
    assert_one_line_error(r, 2, "mosquitto_passwd")
    assert list((base / "y").iterdir()) == []


def test_pilot_walk_from_init_to_a_pull_rollout(
    cli: Cli, base: Path, hermetic: Path, mnist_bundle: Path, mnist_video: LabeledVideo
) -> None:
    require("FLEET_SERVERS", servers_available())
    setup = _init(cli, base / "fleet", "--public-host", "127.0.0.1", "--json")
    servers = {
        s["name"]: ServerProcess(s["argv"], s["listen"], base / f"{s['name']}.log") for s in setup["servers"]
    }  # mosquitto, then the origin, the read-only endpoint, the cache (which needs the read-only one up)
    inventory = base / "devices.toml"
    dev = None
    try:
        for server in servers.values():
            server.start()
        for key in ("fleet-1", "rollout-1"):
            assert cli("keys", "generate", key).code == 0

        # the device's broker user, as `agent install --broker-passwd` adds it; then `systemctl reload`
        password = secrets.token_urlsafe(24)
        (base / "dev1-password").write_text(password)
        record_broker_user("dev1", base / "dev1-password", Path(setup["broker_passwd"]))
        assert servers["mosquitto"].proc is not None
        servers["mosquitto"].proc.send_signal(signal.SIGHUP)
        source = f"file:{mnist_video.path}"
        dev = watch_device(
            base / "dev1", inventory, source, password, setup["device_broker"], setup["device_registry"]
        ).start()
        wait_for(lambda: f"connected to the broker {setup['device_broker']} as dev1" in dev.log(), 30)

        def publish(bundle: Path) -> None:
            env = {"EDGEDEPLOY_REGISTRY_PASSWORD": Path(setup["publisher_password_file"]).read_text().strip()}
            registry = f"{setup['publish_registry']}/models/mnist"
            r = cli("publish", str(bundle), "--registry", registry, "--user", "publisher", env=env)
            assert r.code == 0, r.out + r.err

        a = signed(cli, mnist_bundle, base / "a.edb")
        publish(a)
        r = cli("rollout", str(a), "--devices", "dev1", "--via", "mqtt", "--inventory", str(inventory), timeout=240)
        assert r.code == 0, r.out + r.err + dev.log()
        assert dev.current() == read_manifest(a).release_name
        assert "committed" in r.out

        # the broker goes away and comes back: the watch says so, once each. Right after a commit the watch
        # reconnects once to renew its last will (it must name the new release): a broker stopped during that
        # reconnect is "cannot reach the broker", not "lost the broker" (seen in a loaded CI run)
        seen = len(dev.log())
        servers["mosquitto"].stop()
        wait_for(lambda: any(w in dev.log()[seen:] for w in ("lost the broker", "cannot reach the broker")), 30)
        servers["mosquitto"].start()
        wait_for(lambda: "reconnected to the broker" in dev.log()[seen:], 30)

        # the devices' registry endpoint is down: the rollout fails with the device's own reason
        servers["registry-cache"].stop()
        b = signed(cli, mnist_bundle, base / "b.edb")
        publish(b)
        r = cli(
            "rollout", str(b), "--devices", "dev1", "--via", "mqtt", "--pull-timeout", "5", "--timeout", "5",
            "--inventory", str(inventory), timeout=240,
        )  # fmt: skip
        assert r.code == 1, r.out + r.err
        said = "failed [timeout]: no outcome from dev1 within 10 s (last status downloading; it reports pull-failed: "
        assert f"{said}cannot reach the registry at {setup['device_registry']}/v2/models/mnist/" in r.out, r.out
        assert dev.current() == read_manifest(a).release_name
    finally:
        if dev is not None:
            dev.close()
        for server in reversed(servers.values()):
            server.stop()
