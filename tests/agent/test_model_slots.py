"""Several models on one device: model slots (ROOT/models/<slot>/), each with its own releases, health and
rollback, and a root from before slots moved into the `default` slot, also when a crash cuts the move."""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import HealthCheckFailed, StateError
from edgedeploy_agent.lifecycle import Deployment, rollback
from edgedeploy_agent.report import Report
from edgedeploy_agent.spool import Spool
from edgedeploy_agent.store import LEGACY_RUN_FILES, DeviceStore, migrate_layout
from tests.agent.bundles import copy, make_bundle, make_report
from tests.agent.doubles import ScriptedService, lay_out_as_before_slots
from tests.helpers import agent


@pytest.fixture
def store(tmp_path: Path) -> DeviceStore:
    s = DeviceStore(tmp_path / "device")
    s.init(AgentConfig(device_name="t", keep_releases=2))
    return s


def _deploy(store: DeviceStore, svc: ScriptedService, bundle: Path) -> dict[str, Any]:
    return Deployment(store, svc).deploy(copy(bundle, store.incoming), timeout=2)


@pytest.mark.parametrize("name", ["default", "cam2", "det_v1-a", "0", "a" * 32])
def test_slot_names_that_are_taken(name: str, tmp_path: Path) -> None:
    assert DeviceStore(tmp_path, name).slot_dir == tmp_path / "models" / name


@pytest.mark.parametrize("name", ["", "..", ".", "a/b", "../x", "Cam", "-a", "_a", "a b", "a" * 33, "a\n", "ä"])
def test_slot_names_that_are_refused(name: str, tmp_path: Path) -> None:
    """A slot name becomes a folder name: nothing that leaves models/, hides, or differs only by case."""
    with pytest.raises(StateError, match="is not a model name"):
        DeviceStore(tmp_path, name)
    with pytest.raises(ValidationError, match="is not a model slot name"):
        AgentConfig(device_name="t", models={name: {}})


def test_a_bad_model_name_on_the_command_line_is_one_line(store: DeviceStore) -> None:
    r = agent("--root", str(store.root), "--json", "rollback", "--model", "../etc")
    assert r.code == 9 and json.loads(r.out)["error"]["message"].startswith("'../etc' is not a model name"), r.out
    r = agent("--root", str(store.root), "rollback", "--model", "cam9")
    assert r.code == 9 and r.err.startswith("error: this device has no model 'cam9' (models: default)"), r.err
    with pytest.raises(ValidationError, match="not 'default'"):
        AgentConfig(device_name="t", models={"default": {}})


def test_two_slots_are_deployed_health_checked_and_rolled_back_independently(
    store: DeviceStore, tmp_path: Path
) -> None:
    a, b = store, store.for_slot("cam2")
    bundles = {v: make_bundle(tmp_path / v, version=v, lib_bytes=v.encode()) for v in ("a1", "a2", "b1", "b2", "b3")}
    name = {v: read_manifest(p).release_name for v, p in bundles.items()}
    svc_a, svc_b = ScriptedService(a), ScriptedService(b, bad={name["b3"]})
    for v in ("a1", "a2"):
        assert _deploy(a, svc_a, bundles[v])["outcome"] == "committed"
    for v in ("b1", "b2"):
        assert _deploy(b, svc_b, bundles[v])["outcome"] == "committed"
    assert a.slots() == ["default", "cam2"]
    assert (a.current(), b.current()) == (name["a2"], name["b2"])
    assert sorted(p.name for p in b.releases.iterdir()) == sorted([name["b1"], name["b2"]])
    before_a = a.state_path.read_bytes()

    # a bad push to cam2: cam2 goes back to b2, default keeps serving a2 and was never restarted
    restarts_a = svc_a.restarts
    with pytest.raises(HealthCheckFailed, match=f"back on {name['b2']}"):
        _deploy(b, svc_b, bundles["b3"])
    assert b.current() == b.state()["current"] == name["b2"] and b.state()["history"][-1]["event"] == "rolled-back"
    assert a.current() == name["a2"] and a.state_path.read_bytes() == before_a
    assert svc_a.restarts == restarts_a and svc_a.running and svc_b.running
    assert json.loads((a.run_dir / "health.json").read_text())["release"] == name["a2"]
    assert json.loads((b.run_dir / "health.json").read_text())["release"] == name["b2"]

    # a manual rollback of default leaves cam2 where it is
    before_b = b.state_path.read_bytes()
    assert rollback(a, svc_a, timeout=2)["release"] == name["a1"]
    assert (a.current(), b.current()) == (name["a1"], name["b2"]) and b.state_path.read_bytes() == before_b

    # the device's answer names every slot; `--model` picks the one at the top
    facts = json.loads(agent("--root", str(a.root), "--json", "facts", "--model", "cam9").out)
    assert facts["current"] is None and a.slots() == ["default", "cam2"]  # read only: asking creates no slot
    facts = json.loads(agent("--root", str(a.root), "--json", "facts", "--model", "cam2").out)
    assert facts["slot"] == "cam2" and facts["current"]["release"] == name["b2"]
    assert {s: f["current"]["release"] for s, f in facts["models"].items()} == {
        "default": name["a1"],
        "cam2": name["b2"],
    }


def test_each_slot_has_its_own_source_and_the_device_its_own(store: DeviceStore) -> None:
    r = agent("--root", str(store.root), "--json", "init", "--model", "cam2", "--source", "file:/b.mp4")
    assert r.code == 0, r.err
    agent("--root", str(store.root), "--json", "init", "--source", "file:/a.mp4")
    assert store.config().source == "file:/a.mp4"
    cam2 = store.for_slot("cam2")
    assert cam2.config().source == "file:/b.mp4" and cam2.config().device_name == "t"
    assert store.slots() == ["default", "cam2"] and cam2.state()["current"] is None
    cam2.set_source(None)
    assert cam2.config().source is None and store.config().source == "file:/a.mp4"
    # systemd mode: a slot is served by a unit of its own, never by the default's: the instance of the template
    # `agent install` makes (restarted without sudo through its own path unit and request file), unless agent.json
    # names another (restarted through sudo only: its path unit, if any, is not one this agent knows)
    from edgedeploy_agent.service import SystemdService, make_service

    agent("--root", str(store.root), "--json", "init", "--service", "systemd")
    default, slot = make_service(store), make_service(cam2)
    assert isinstance(default, SystemdService) and isinstance(slot, SystemdService)
    assert (default.unit, default.path_unit) == ("edgedeploy-agent.service", "edgedeploy-agent-restart.path")
    assert (slot.unit, slot.path_unit) == ("edgedeploy-agent@cam2.service", "edgedeploy-agent-restart@cam2.path")
    store.update_config(models={"cam2": {"unit": "plates.service"}})
    named = make_service(cam2)
    assert isinstance(named, SystemdService) and (named.unit, named.path_unit) == ("plates.service", None)


def test_reports_of_two_slots_share_the_spool_and_are_numbered_per_slot(store: DeviceStore) -> None:
    a, b = Spool(store), Spool(store.for_slot("cam2"))
    for spool in (a, b, b):
        spool.write(make_report(spool.next_seq()))
    files = sorted(p.name for p in store.spool.glob("*.jsonl"))
    assert [f.split("-", 1)[1] for f in files] == ["00000001.jsonl", "cam2-00000001.jsonl", "cam2-00000002.jsonl"]
    slots = sorted(Report.model_validate_json(p.read_text()).slot for p in store.spool.glob("*.jsonl"))
    assert slots == ["cam2", "cam2", "default"]
    # a restarted agent of each slot continues after its own last number
    assert (Spool(store).seq, Spool(store.for_slot("cam2")).seq) == (1, 2)


# --- a root from before slots ---------------------------------------------------------------------------


def _legacy(store: DeviceStore, tmp_path: Path) -> tuple[str, bytes]:
    """A root in the layout from before slots (releases/, current, state.json and run/'s files at the top), with
    two releases and a history: deployed by this agent, then laid out as the earlier one kept it."""
    svc = ScriptedService(store)
    for v in ("1", "2"):
        _deploy(store, svc, make_bundle(tmp_path / v, version=v, lib_bytes=v.encode()))
    (store.run_dir / "agent.pid").write_text("12345\n")
    (store.run_dir / "report_seq").write_text("7")
    current = store.current()
    assert current is not None
    lay_out_as_before_slots(store.root)
    return current, (store.root / "state.json").read_bytes()


def _check_migrated(store: DeviceStore, current: str, state: bytes) -> None:
    root = store.root
    assert not any((root / n).exists() or (root / n).is_symlink() for n in ("releases", "current", "state.json"))
    assert store.current() == current and os.readlink(store.current_link) == f"releases/{current}"
    assert store.state_path.read_bytes() == state and store.state()["current"] == current
    assert store.load_release(current).release_name == current  # every artifact where its manifest says
    assert len(list(store.releases.iterdir())) == 2
    assert (store.run_dir / "agent.pid").read_text() == "12345\n" and (store.run_dir / "report_seq").read_text() == "7"
    assert not any((root / "run" / n).exists() for n in LEGACY_RUN_FILES)


def test_a_new_slot_is_shared_with_the_group_as_the_installed_root_is(store: DeviceStore) -> None:
    """In systemd mode the root is group-writable and setgid (`agent install`) for the service user and the
    deploying login: a slot made later by either (umask 022 or the units' 0027) must stay writable by the other.
    Found by the arm64 systemd test: a push by the login made models/cam2/run 2755, and the slot's agent could
    not write its health there."""
    for d in (store.root, store.root / "models"):
        os.chmod(d, 0o2770)
    old = os.umask(0o022)
    try:
        cam2, cam3 = store.for_slot("cam2"), store.for_slot("cam3")
        with cam2.exclusive("test"):  # a push makes the slot's folder for its lock first
            cam2.ensure_slot()
        os.chmod(store.root / "models", 0o755)  # a root that is not shared (process mode): the umask decides
        cam3.ensure_slot()
    finally:
        os.umask(old)
    for d in (cam2.slot_dir, cam2.releases, cam2.run_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o2775, (d, oct(d.stat().st_mode))
    for d in (cam3.slot_dir, cam3.releases, cam3.run_dir):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, (d, oct(d.stat().st_mode))


def test_a_root_from_before_slots_is_moved_into_the_default_slot(store: DeviceStore, tmp_path: Path) -> None:
    current, state = _legacy(store, tmp_path)
    r = agent("--root", str(store.root), "--json", "facts")  # any command finishes it first
    facts = json.loads(r.out)
    assert facts["current"]["release"] == current and facts["slot"] == "default", r.out + r.err
    _check_migrated(store, current, state)
    assert migrate_layout(store.root) is False  # nothing left to do
    # and the device carries on: a rollback to the release it kept, then a new deploy
    svc = ScriptedService(store)
    assert rollback(store, svc, timeout=2)["previous"] == current
    assert _deploy(store, svc, make_bundle(tmp_path / "3", version="3", lib_bytes=b"3"))["outcome"] == "committed"


class Crash(BaseException):
    """A crash at one file-system step (BaseException: no `except Exception` in the code under test stops it)."""


def _crash_at(monkeypatch: pytest.MonkeyPatch, n: int) -> Callable[[], int]:
    """Make the n-th rename, replace, symlink or unlink from now raise Crash, before it happens."""
    calls = [0]

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def step(*args: Any, **kw: Any) -> Any:
            calls[0] += 1
            if calls[0] == n:
                raise Crash(f"crashed before {fn.__name__}{args}")
            return fn(*args, **kw)

        return step

    for name in ("rename", "replace", "symlink", "unlink"):
        monkeypatch.setattr(os, name, wrap(getattr(os, name)))
    return lambda: calls[0]


def test_a_move_cut_at_every_step_is_finished_by_the_next_command(
    store: DeviceStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The move is cut before each of its file-system steps in turn (a crash leaves the disk as it was at that
    point); the next command finishes it, and the device is on the release it ran, with its whole state."""
    current, state = _legacy(store, tmp_path)
    pristine = tmp_path / "pristine"
    shutil.copytree(store.root, pristine, symlinks=True)
    cut = 0
    while True:
        cut += 1
        shutil.rmtree(store.root)
        shutil.copytree(pristine, store.root, symlinks=True)
        with monkeypatch.context() as m:
            steps = _crash_at(m, cut)
            try:
                migrate_layout(store.root)
            except Crash:
                pass
            else:
                break
            assert steps() >= cut  # (cleanup code may have run after the crash: a real one leaves a temp file)
        assert (store.root / "state.json").is_file(), f"cut at step {cut}: the root no longer says it is unfinished"
        r = agent("--root", str(store.root), "--json", "recover")  # the agent's start, or any command
        assert r.code == 0 and json.loads(r.out)["current"] == current, f"cut at step {cut}: {r.out} {r.err}"
        _check_migrated(store, current, state)
    assert cut > 8  # every step was cut once: releases, the link, the run files, the state
    _check_migrated(store, current, state)


def test_a_slot_whose_unit_systemd_does_not_have_is_refused_with_the_install_hint(
    store: DeviceStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device installed before slot units: the deploy to a new slot stops at once with what to run, instead of a
    restart that fails and a health check that waits for nothing. systemctl answers as systemd(1) does for a unit
    it has no file for (tests/agent/fixtures/systemctl/not-found.txt): this machine has no systemd as PID 1."""
    from edgedeploy_agent.service import SystemdService

    shim = tmp_path / "bin" / "systemctl"
    shim.parent.mkdir()
    shim.write_text('#!/bin/sh\n[ "$1" = show ] && echo not-found\nexit 0\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}:{os.environ['PATH']}")
    with pytest.raises(StateError, match="systemd has no unit edgedeploy-agent@cam2.service") as e:
        SystemdService(store.for_slot("cam2"), "edgedeploy-agent@cam2.service").restart()
    assert e.value.hint is not None and "edgedeploy agent install" in e.value.hint


def test_slots_transition_at_once_and_what_changes_the_whole_device_waits_for_all(
    store: DeviceStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deploy to one slot does not wait for another slot's (one slot's TensorRT engine build takes minutes); two
    transitions of one slot refuse each other. The device lock (ROOT/.lock, which an agent from before per-slot
    locks takes exclusively for its deploys) is held shared by every slot's transition: the move of a root from
    before slots waits until none runs, and no transition starts while it (or an older agent's deploy) runs."""
    cam2 = store.for_slot("cam2")
    with cam2.exclusive("deploy"):
        with store.exclusive("deploy"):
            assert store.busy() and cam2.busy()
        assert cam2.busy() and not store.busy()  # a cut-off transition of default is finished meanwhile
        with pytest.raises(StateError, match=r"running on this device \(model cam2\); rollback refused"):
            with cam2.exclusive("rollback"):
                pass
        with pytest.raises(StateError, match="a deploy or rollback is running on this device; move refused"):
            with store.device_exclusive("move"):
                pass
        current, _ = _legacy(store, tmp_path)
        monkeypatch.setattr("edgedeploy_agent.store.MIGRATION_LOCK_WAIT_S", 0.5)
        with pytest.raises(StateError, match="a deploy or rollback is running"):
            migrate_layout(store.root)
        assert (store.root / "state.json").is_file() and store.current() is None  # not moved under cam2's deploy
    assert migrate_layout(store.root) is True and store.current() == current
    with store.device_exclusive("move"):
        for slot in (store, cam2):
            assert slot.busy()
            with pytest.raises(StateError, match="another deploy or rollback is running on this device"):
                with slot.exclusive("deploy"):
                    pass


def test_config_changes_are_one_at_a_time_on_the_device_and_never_wait_for_a_transition(store: DeviceStore) -> None:
    """agent.json's read-modify-write holds the device's config lock: a second change (another process: two pushes
    to two slots set their sources) waits for the first instead of writing over it; a slot's deploy in flight does
    not hold it up."""
    import subprocess
    import time

    from tests.helpers import BIN

    argv = [str(BIN / "edgedeploy-agent"), "--root", str(store.root), "--json", "init", "--model", "cam2"]
    with store.config_lock():
        proc = subprocess.Popen([*argv, "--source", "file:/b.mp4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while proc.poll() is None and not _waits_for_a_lock(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and "cam2" not in store.device_config().models  # waiting for the lock
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert store.for_slot("cam2").config().source == "file:/b.mp4"
    with store.exclusive("deploy"), store.for_slot("cam2").exclusive("deploy"):
        r = agent(*argv[1:], "--source", "file:/c.mp4")
        assert r.code == 0 and store.for_slot("cam2").config().source == "file:/c.mp4", r.err


def _waits_for_a_lock(pid: int) -> bool:
    """Whether process `pid` is blocked in flock(2): the kernel lists a waiter with `->` in /proc/locks."""
    return any(
        ln.split()[1] == "->" and ln.split()[5] == str(pid) for ln in Path("/proc/locks").read_text().splitlines()
    )


def test_blobs_another_slots_transition_may_be_linking_are_not_collected(store: DeviceStore, tmp_path: Path) -> None:
    """A verified blob that no release links yet (one link) is what garbage collection removes, and what a deploy
    in another slot has between verifying its blobs and linking them: a deploy that commits while another slot's
    transition runs leaves the blobs; the next one with no other transition running collects them."""
    from edgedeploy_agent.blobs import BlobStore

    blobs = BlobStore(store.root)
    blobs.init()
    in_flight = blobs.path("ab" * 32)
    in_flight.write_bytes(b"an artifact cam2 verified and has not linked yet")
    cam2, svc = store.for_slot("cam2"), ScriptedService(store)
    with cam2.exclusive("deploy"):
        with store.exclusive("deploy"):
            assert _deploy(store, svc, make_bundle(tmp_path / "1", version="1"))["outcome"] == "committed"
            with store.sole_blob_user() as sole:
                assert not sole
        assert in_flight.is_file()
    with store.exclusive("deploy"):
        assert _deploy(store, svc, make_bundle(tmp_path / "2", version="2"))["outcome"] == "committed"
    assert not in_flight.exists()
