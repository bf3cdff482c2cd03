"""The host's side of verify, logs and wheelhouses: pure functions over the agent's answers and inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgedeploy.cli.verify import group_exit_code
from edgedeploy.errors import ConnectionFailed, DeviceError, InputError
from edgedeploy.inventory import Device
from edgedeploy.remote.fleet import FleetResult
from edgedeploy.remote.logs import device_error, logs_argv
from edgedeploy.remote.verify import Checkup, too_old, with_host_view
from edgedeploy.remote.wheelhouse import WheelhouseMismatch, check_wheelhouse, platform_tags
from edgedeploy_agent.selftest import FAILED, OK, WARNING, Check

DEV = Device(name="cam-01", host="10.0.0.5", profile="cpu-x86_64", root="/var/lib/edgedeploy")


def _answer(device_time: float, agent_version: str = "0.1.0") -> dict:
    checks = [
        Check("agent", OK, "edgedeploy-agent", data={"agent_version": agent_version}),
        Check("clock", OK, "device clock", data={"time": device_time}),
    ]
    return {"checks": [c.as_dict() for c in checks]}


def test_host_view_measures_the_skew_within_the_round_trip() -> None:
    ok = with_host_view("cam-01", _answer(1000.1), 1000.0, 1000.4, "0.1.0")
    assert ok.overall == OK and ok.checks[1].data["skew_s"] == pytest.approx(-0.1)
    late = with_host_view("cam-01", _answer(1000.0 - 7200), 1000.0, 1000.4, "0.1.0")
    assert late.checks[1].status == FAILED and "-7200.2 s from the host" in late.checks[1].detail
    stale = with_host_view("cam-01", _answer(1000.2, agent_version="0.0.9"), 1000.0, 1000.4, "0.1.0")
    assert stale.checks[0].status == WARNING and "edgedeploy agent install cam-01" in str(stale.checks[0].fix)
    before_bundle = _answer(1000.2)
    before_bundle["checks"][1]["status"] = FAILED  # the agent saw its clock behind the bundle's build
    assert with_host_view("cam-01", before_bundle, 1000.0, 1000.4, "0.1.0").checks[1].status == FAILED


def test_fleet_exit_codes() -> None:
    good = Checkup("a", [Check("x", WARNING, "")])
    bad = Checkup("b", [Check("x", FAILED, "")])
    assert group_exit_code(FleetResult({"a": good, "c": good})) == 0
    assert group_exit_code(FleetResult({"a": good, "b": bad})) == 5  # the fleet commands' "partial"
    assert group_exit_code(FleetResult({"a": good}, {"d": ConnectionFailed("down")})) == 5
    assert group_exit_code(FleetResult({"b": bad}, {"d": ConnectionFailed("down")})) == 1


def test_logs_argv_is_built_from_validated_values() -> None:
    assert logs_argv(DEV, 50, 3600.0, True) == [
        "edgedeploy-agent", "--root", "/var/lib/edgedeploy", "--json", "logs", "--lines", "50", "--since", "3600s",
        "--follow",
    ]  # fmt: skip
    assert logs_argv(DEV, 1, None, False)[-2:] == ["--lines", "1"]
    assert logs_argv(DEV, 1, None, False, "cam2")[-4:] == ["--lines", "1", "--model", "cam2"]
    for bad in (0, 10001):
        with pytest.raises(InputError, match="--lines"):
            logs_argv(DEV, bad, None, False)


def test_device_errors_from_the_agents_stderr() -> None:
    err = {"ok": False, "error": {"code": "log-unavailable", "message": "no agent log", "hint": "push"}}
    e = device_error(DEV, 13, json.dumps(err).encode())
    assert (e.code, e.message, e.hint) == ("log-unavailable", "cam-01: no agent log", "push")
    assert device_error(DEV, 127, b"sh: edgedeploy-agent: not found").code == "agent-missing"
    old = device_error(DEV, 2, b"edgedeploy-agent: error: argument command: invalid choice: 'logs'")
    assert old.code == "agent-too-old" and "agent install cam-01" in str(old.hint)
    assert too_old(DeviceError("other"), DEV, "selftest").code == "device-error"


def test_platform_tags_cover_older_glibc() -> None:
    tags = platform_tags("manylinux_2_28_aarch64")
    assert (
        tags[0] == "manylinux_2_28_aarch64" and "manylinux_2_17_aarch64" in tags and tags[-1] == "manylinux2014_aarch64"
    )
    assert platform_tags("musllinux_1_2_x86_64") == ["musllinux_1_2_x86_64"]


def test_wheelhouse_for_another_device_is_refused(tmp_path: Path) -> None:
    check_wheelhouse(tmp_path, "3.9", "aarch64")  # a hand-made folder: taken as it is
    (tmp_path / "wheelhouse.json").write_text(json.dumps({"python": "3.9", "arch": "aarch64"}))
    check_wheelhouse(tmp_path, "3.9", "aarch64")
    with pytest.raises(WheelhouseMismatch, match="is for Python 3.9 on aarch64, the device has Python 3.8") as e:
        check_wheelhouse(tmp_path, "3.8", "aarch64")
    assert "--python 3.8 --platform manylinux_2_28_aarch64" in str(e.value.hint)
    with pytest.raises(WheelhouseMismatch):
        check_wheelhouse(tmp_path, "3.9", "x86_64")
