"""The pure rollout planner and the halt rule's arithmetic: no I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgedeploy.errors import InputError
from edgedeploy.inventory import Device, Inventory
from edgedeploy.remote.facts import parse_facts
from edgedeploy.remote.fleet import run_fleet
from edgedeploy.remote.plan import HealthPolicy
from edgedeploy.remote.rollout import RolloutState, parse_fraction, plan_rollout
from edgedeploy.remote.rollout_runner import RolloutRunner, prepare_resume
from tests.host.doubles import FACTS

NAMES = [f"d{i:02d}" for i in range(10)]


def facts(release: str | None = None) -> dict:
    running = {"current": {"release": release}, "health": {"release": release, "state": "ready"}}
    f = parse_facts({**FACTS, **(running if release else {"current": None, "health": None})})
    return dict.fromkeys(NAMES, f)


def test_canary_then_waves_by_percent() -> None:
    s = plan_rollout("r", "b.edb", "m-2-x", NAMES, facts("m-1-y"), canary=2, wave="50%", max_fail=0.2)
    assert s.waves == [["d00", "d01"], NAMES[2:6], NAMES[6:10]]
    assert s.fail_budget == 2 and all(d.status == "pending" for d in s.devices.values())
    assert "canary: replace m-1-y" in s.devices["d00"].detail


def test_unreachable_devices_are_planned_with_the_reason() -> None:
    f: dict = {**facts(), "d03": "d03 (x@h:22): unreachable (No route to host)"}
    s = plan_rollout("r", "b.edb", "m-2-x", NAMES, f, canary=0, wave="3")
    assert s.waves == [NAMES[0:3], NAMES[3:6], NAMES[6:9], NAMES[9:]]
    assert "unreachable now" in s.devices["d03"].detail


def test_devices_already_on_the_release_are_no_ops() -> None:
    s = plan_rollout("r", "b.edb", "m-2-x", NAMES, facts("m-2-x"), canary=1)
    assert all("already runs" in d.detail for d in s.devices.values())


def test_exit_codes_resume_and_json_round_trip() -> None:
    s = plan_rollout("r", "b.edb", "m-2-x", NAMES[:3], facts(), canary=1)
    assert s.exit_code() == 1
    s.devices["d00"].status = "committed"
    s.devices["d01"].status = "failed"
    assert s.exit_code() == 5 and s.failed == ["d01"] and s.untouched == ["d02"]
    again = RolloutState.from_json(s.to_json())
    assert again == s
    prepare_resume(again)
    assert [d.status for d in again.devices.values()] == ["committed", "pending", "pending"]
    s.devices["d01"].status = s.devices["d02"].status = "unchanged"
    assert s.exit_code() == 0


def test_bad_specs() -> None:
    assert parse_fraction("10%", "x") == pytest.approx(0.1)
    for bad in ("abc", "150%", "-1"):
        with pytest.raises(InputError):
            parse_fraction(bad, "--max-fail")
    with pytest.raises(InputError, match="no devices"):
        plan_rollout("r", "b", "m", [], {})
    with pytest.raises(InputError, match="--wave"):
        plan_rollout("r", "b", "m", NAMES, facts(), wave="x")


class SurprisedRunner(RolloutRunner):
    """A runner whose delivery (the interface mqtt_rollout.py overrides too) hits a bug on one device."""

    def _deliver(self, name: str) -> tuple[str, str, str | None]:
        if name == "d03":
            raise KeyError("a bug")
        return "committed", "ok", "m-2-x"

    def _release_after_failure(self, name: str) -> str | None:
        return "m-1-y"


def test_an_unexpected_error_on_one_device_fails_it_and_no_other(tmp_path: Path) -> None:
    s = plan_rollout("r", "b.edb", "m-2-x", NAMES, facts("m-1-y"), canary=1, wave="50%", max_fail=0.2)
    inv = Inventory(tmp_path / "devices.toml", {n: Device(name=n, host="h", profile="cpu-x86_64") for n in NAMES})
    runner = SurprisedRunner(inv, s, None, tmp_path / "r.json", HealthPolicy())  # type: ignore[arg-type]
    done = runner.run()
    assert done.status == "done" and done.failed == ["d03"] and done.exit_code() == 5
    assert done.devices["d03"].code == "EdgeDeployError" and "KeyError" in done.devices["d03"].detail
    assert sorted(done.succeeded) == sorted(n for n in NAMES if n != "d03")


def test_run_fleet_keeps_every_result_and_a_bug_as_a_failure() -> None:
    def fn(name: str) -> int:
        if name == "b":
            raise ZeroDivisionError("boom")
        if name == "c":
            raise InputError("bad")
        return len(name)

    r = run_fleet(["a", "b", "c", "dd"], fn, name=str)
    assert r.succeeded == {"a": 1, "dd": 2} and sorted(r.failed) == ["b", "c"]
    assert "ZeroDivisionError: boom" in r.failed["b"].message and r.exit_code == 5
