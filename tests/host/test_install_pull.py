"""`agent install --mqtt`: the pull part of the install plan is pure (facts in, steps out), its facts come from
the install's one probe (run here for real by sh on a local folder), and a second run plans nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from edgedeploy.errors import InputError
from edgedeploy.fleet_servers import servers_available
from edgedeploy.remote.install import InstallSpec, parse_install_probe, run_probe
from edgedeploy.remote.install_pull import (
    PULL_PROBE,
    PullOptions,
    parse_pull_probe,
    plan_pull,
    record_broker_user,
    write_pull_files,
)
from edgedeploy.remote.transport import LocalTransport
from edgedeploy.signing import generate_key
from edgedeploy_agent.trust import key_id, parse_public_key
from edgedeploy_agent.unit import WATCH_UNIT
from tests.helpers import Cli, assert_one_line_error, require


@pytest.fixture
def pull(hermetic: Path) -> PullOptions:
    return PullOptions("broker.site:1883", "http://cache.site:5000", generate_key("rollout-1").public)


def _spec(root: Path, mode: str = "systemd") -> InstallSpec:
    return InstallSpec("python3", "/opt/edgedeploy/venv", str(root), mode, "edgedeploy", (), None)


def _names(steps: list) -> list[str]:  # type: ignore[type-arg]
    return [s.name for s in steps]


def test_a_fresh_device_gets_password_config_and_the_watch_unit(tmp_path: Path, pull: PullOptions) -> None:
    spec = _spec(tmp_path / "root")
    (tmp_path / "root").mkdir()
    stdout = run_probe(LocalTransport(), spec, PULL_PROBE)  # the install's probe with the pull lines, real sh
    assert parse_install_probe(stdout).python  # one script answers both parsers
    facts = parse_pull_probe(stdout)
    assert not facts.mqtt_password and facts.watch_config_sha256 is None and facts.rollout_keys == ()
    files = write_pull_files(spec, pull, tmp_path)
    steps = plan_pull(facts, spec, pull, files)
    assert _names(steps) == [
        "make a private upload folder",
        "upload broker password",
        "install broker password",
        "remove the upload folder",
        "configure watch",
        "hand the watch config to the service user",
        f"install {WATCH_UNIT}",
        "reload systemd",
        f"enable {WATCH_UNIT}",
        "start pull units",
    ]  # fmt: skip  (the restart path unit comes with every systemd install: test_install_plan.py)
    by_name = {s.name: s for s in steps}
    # the password reaches the device through a private folder, as a file the service user alone can read
    assert by_name["upload broker password"].put[1].startswith(files.upload_dir + "/")  # type: ignore[index]
    assert not by_name["upload broker password"].root and by_name["install broker password"].root
    assert by_name["install broker password"].argv[:6] == ("install", "-m", "0600", "-o", "edgedeploy", "-g")
    assert (files.password.stat().st_mode & 0o777) == 0o600 and len(files.password.read_text().strip()) >= 24
    configure = by_name["configure watch"].argv
    assert configure[0] == "/opt/edgedeploy/venv/bin/edgedeploy-agent" and pull.rollout_key in configure
    assert by_name["hand the watch config to the service user"].argv[-2:] == ("edgedeploy", str(tmp_path / "root"))
    assert "ExecStart=/opt/edgedeploy/venv/bin/edgedeploy-agent --root " in files.units[WATCH_UNIT].read_text()


def test_a_device_that_has_it_all_plans_nothing_and_a_new_broker_only_reconfigures(
    tmp_path: Path, pull: PullOptions
) -> None:
    root = tmp_path / "root"
    (root / "trust" / "rollout").mkdir(parents=True)
    spec = _spec(root)
    files = write_pull_files(spec, pull, tmp_path)
    (root / "watch.json").write_bytes(files.watch_config.read_bytes())  # what watch-config writes
    (root / "mqtt-password").write_text("kept\n")
    kid = key_id(parse_public_key(pull.rollout_key))
    (root / "trust" / "rollout" / f"{kid}.pub").write_text(pull.rollout_key + "\n")
    units = "".join(
        f"unit_sha256:{n}={hashlib.sha256(p.read_bytes()).hexdigest()}\n" for n, p in files.units.items()
    )  # the unit folder is /etc/systemd/system: as the probe prints it for installed units
    facts = parse_pull_probe(run_probe(LocalTransport(), spec, PULL_PROBE) + units)
    assert facts.mqtt_password and facts.rollout_keys == (kid,)
    assert plan_pull(facts, spec, pull, files) == []

    moved = dataclasses.replace(pull, broker="broker2.site:1883")
    (tmp_path / "again").mkdir()
    files2 = write_pull_files(spec, moved, tmp_path / "again")
    assert _names(plan_pull(facts, spec, moved, files2)) == [
        "configure watch", "hand the watch config to the service user", "start pull units",
    ]  # fmt: skip
    assert json.loads(files2.watch_config.read_text())["broker"] == "broker2.site:1883"


def test_process_mode_and_bad_values_are_refused_in_one_line(tmp_path: Path, pull: PullOptions) -> None:
    spec = _spec(tmp_path, mode="process")
    files = write_pull_files(_spec(tmp_path), pull, tmp_path)
    with pytest.raises(InputError, match="service = systemd"):
        plan_pull(parse_pull_probe(""), spec, pull, files)
    with pytest.raises(InputError, match="--mqtt/--registry"):
        write_pull_files(_spec(tmp_path), dataclasses.replace(pull, broker="no port"), tmp_path)


@pytest.mark.fleet_servers
def test_the_broker_user_is_added_hashed_and_the_password_kept_here(tmp_path: Path, hermetic: Path) -> None:
    require("FLEET_SERVERS", servers_available())  # mosquitto_passwd hashes the password
    password = tmp_path / "pw"
    password.write_text("s3cret-device-password\n")
    passwd = tmp_path / "passwd"
    passwd.write_text("controller:$7$old\ncam1:$7$stale\n")
    kept = record_broker_user("cam1", password, passwd)
    assert kept.read_text() == "s3cret-device-password\n" and kept.stat().st_mode & 0o777 == 0o600
    lines = passwd.read_text().splitlines()
    assert lines[0] == "controller:$7$old" and len(lines) == 2
    user, hashed = lines[1].split(":", 1)
    assert user == "cam1" and hashed.startswith("$7$") and "s3cret" not in hashed


def test_the_cli_refuses_half_an_mqtt_setup_in_one_line(cli: Cli) -> None:
    assert_one_line_error(cli("agent", "install", "cam1", "--registry", "http://c:5000"), 2, "go with --mqtt BROKER")
    assert_one_line_error(cli("agent", "install", "cam1", "--mqtt", "b:1883"), 2, "--mqtt needs --registry")
    r = cli("agent", "install", "cam1", "--mqtt", "b:1883", "--registry", "http://c:5000", "--rollout-key", "nope")
    assert_one_line_error(r, 2, "no signing key named 'nope'")


def test_a_fleet_ca_is_uploaded_and_named_in_the_watch_config(tmp_path: Path, pull: PullOptions) -> None:
    ca = tmp_path / "fleet-ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    with_ca = dataclasses.replace(pull, ca_file=ca)
    spec = _spec(tmp_path / "root")
    files = write_pull_files(spec, with_ca, tmp_path)
    steps = {s.name: s for s in plan_pull(parse_pull_probe(""), spec, with_ca, files)}
    assert steps["upload fleet CA"].put == (ca, f"{tmp_path}/root/fleet-ca.crt") and steps["upload fleet CA"].root
    assert steps["configure watch"].argv[-2:] == ("--ca-file", f"{tmp_path}/root/fleet-ca.crt")
    assert json.loads(files.watch_config.read_text())["ca_file"] == f"{tmp_path}/root/fleet-ca.crt"
    sha = hashlib.sha256(ca.read_bytes()).hexdigest()
    assert "upload fleet CA" not in _names(
        plan_pull(parse_pull_probe(f"fleet_ca_sha256={sha}\n"), spec, with_ca, files)
    )
