"""The deploy state machine against a scripted service (a real class behind the Service protocol)."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import BundleError, HealthCheckFailed, InsufficientSpace
from edgedeploy_agent.lifecycle import Deployment, recover, rollback
from edgedeploy_agent.service import write_health
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import copy, make_bundle
from tests.agent.doubles import ScriptedService


@pytest.fixture
def store(tmp_path: Path) -> DeviceStore:
    s = DeviceStore(tmp_path / "device")
    s.init(AgentConfig(device_name="t", keep_releases=2))
    return s


def test_commit_then_unchanged_then_upgrade(store: DeviceStore, tmp_path: Path) -> None:
    svc = ScriptedService(store)
    b1 = make_bundle(tmp_path / "v1", version="1")
    r = Deployment(store, svc).deploy(copy(b1, store.incoming), timeout=2)
    name1 = read_manifest(b1).release_name
    assert r["outcome"] == "committed" and store.current() == name1
    assert os.readlink(store.current_link) == f"releases/{name1}"  # relative link
    assert not list(store.incoming.iterdir())  # the upload is removed once committed
    assert Deployment(store, svc).deploy(copy(b1, store.incoming), timeout=2)["outcome"] == "unchanged"
    assert Deployment(store, svc).deploy(copy(b1, store.incoming), timeout=2, force=True)["outcome"] == "committed"
    # its source (a video file) played to the end and the service exited: the same bundle starts it again
    write_health(store, name1, "finished")
    svc.running = False
    assert Deployment(store, svc).deploy(copy(b1, store.incoming), timeout=2)["outcome"] == "committed"
    # serving, and a file of the same release whose payload no longer matches its manifest: refused, not
    # "unchanged" (the upload is checked before the device says there is nothing to do)
    assert svc.is_running()
    raw = bytearray(b1.read_bytes())
    raw[-40] ^= 1  # in the last artifact: the manifest reads as before, the payload no longer matches it
    tampered = tmp_path / "tampered" / b1.name
    tampered.parent.mkdir()
    tampered.write_bytes(bytes(raw))
    assert read_manifest(tampered).release_name == name1
    with pytest.raises(BundleError, match="sha256 mismatch"):
        Deployment(store, svc).deploy(copy(tampered, store.incoming), timeout=2)
    assert not list(store.incoming.iterdir()) and store.current() == name1
    b2 = make_bundle(tmp_path / "v2", version="2", lib_bytes=b"other")
    r = Deployment(store, svc).deploy(copy(b2, store.incoming), timeout=2)
    assert r["previous"] == name1
    st = store.state()
    assert st["current"] == read_manifest(b2).release_name and st["previous"] == [name1] and st["pending"] is None


def test_failed_health_rolls_back_to_previous(store: DeviceStore, tmp_path: Path) -> None:
    b1 = make_bundle(tmp_path / "v1", version="1")
    b2 = make_bundle(tmp_path / "v2", version="2", lib_bytes=b"broken")
    bad = read_manifest(b2).release_name
    svc = ScriptedService(store, bad={bad})
    Deployment(store, svc).deploy(copy(b1, store.incoming), timeout=2)
    with pytest.raises(HealthCheckFailed, match="library does not load.*back on toy-1"):
        Deployment(store, svc).deploy(copy(b2, store.incoming), timeout=2)
    st = store.state()
    assert store.current() == st["current"] == read_manifest(b1).release_name
    assert st["pending"] is None and st["history"][-1]["event"] == "rolled-back"
    assert svc.running  # the old bundle was restarted


def test_tampered_bundle_leaves_device_untouched(store: DeviceStore, tmp_path: Path) -> None:
    svc = ScriptedService(store)
    b1 = make_bundle(tmp_path / "v1", version="1")
    Deployment(store, svc).deploy(copy(b1, store.incoming), timeout=2)
    b2 = make_bundle(tmp_path / "v2", version="2")
    raw = bytearray(b2.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # flip a byte inside the compressed stream
    bad = store.incoming / "bad.edb"
    bad.write_bytes(bytes(raw))
    restarts = svc.restarts
    with pytest.raises(BundleError):
        Deployment(store, svc).deploy(bad, timeout=2)
    assert store.current() == read_manifest(b1).release_name and svc.restarts == restarts
    assert not [p for p in store.releases.iterdir() if p.name.startswith(".tmp")]


def test_interrupted_deploy_is_recovered(store: DeviceStore, tmp_path: Path) -> None:
    svc = ScriptedService(store)
    b1 = make_bundle(tmp_path / "v1", version="1")
    b2 = make_bundle(tmp_path / "v2", version="2", lib_bytes=b"two")
    Deployment(store, svc).deploy(copy(b1, store.incoming), timeout=2)
    # simulate a crash after the link swap, before the health check finished
    store.stage(copy(b2, store.incoming))
    st = store.state()
    st["pending"] = {"release": read_manifest(b2).release_name, "from": st["current"], "state": "health-check"}
    store.save_state(st)
    store.activate(read_manifest(b2).release_name)
    assert recover(store, svc) == read_manifest(b1).release_name
    assert store.current() == read_manifest(b1).release_name and store.state()["pending"] is None


def test_manual_rollback_and_pruning(store: DeviceStore, tmp_path: Path) -> None:
    svc = ScriptedService(store)
    names = []
    for v in ("1", "2", "3"):
        b = make_bundle(tmp_path / v, version=v, lib_bytes=v.encode())
        names.append(read_manifest(b).release_name)
        Deployment(store, svc).deploy(copy(b, store.incoming), timeout=2)
    assert sorted(p.name for p in store.releases.iterdir()) == sorted(names[1:])  # keep_releases=2
    r = rollback(store, svc, timeout=2)
    assert r["release"] == names[1] and store.current() == names[1]


def test_no_space_is_detected_before_unpacking(store: DeviceStore, tmp_path: Path, monkeypatch) -> None:
    import edgedeploy_agent.store as st

    b = make_bundle(tmp_path / "v1")
    monkeypatch.setattr(st, "SPACE_MARGIN_BYTES", 1 << 60)  # more than any disk has
    with pytest.raises(InsufficientSpace, match="MiB free"):
        Deployment(store, ScriptedService(store)).deploy(copy(b, store.incoming), timeout=2)
    assert store.current() is None and json.loads(store.state_path.read_text())["pending"] is None


def test_facts_change_nothing_and_recovery_never_undoes_a_deploy_in_flight(store: DeviceStore, tmp_path: Path) -> None:
    """A second host asking for facts while a deploy holds the device lock leaves the deploy alone; facts
    never recover (they only report the transition); `recover` does, once the device is free."""
    from tests.helpers import agent

    state = store.state()
    state["pending"] = {"release": "x", "from": None, "state": "health-check", "started": "t"}
    store.save_state(state)
    with store.exclusive("deploy"):
        r = agent("--root", str(store.root), "--json", "facts")
        assert json.loads(r.out)["busy"] is True and store.state()["pending"] is not None
        for args in (["deploy", str(tmp_path / "none.edb")], ["recover"]):
            r = agent("--root", str(store.root), "--json", *args)
            assert json.loads(r.out)["error"]["code"] == "state-error"
    before = store.state_path.read_bytes()
    r = agent("--root", str(store.root), "--json", "facts")
    assert json.loads(r.out)["busy"] is False and json.loads(r.out)["pending"]["release"] == "x"
    assert store.state_path.read_bytes() == before
    r = agent("--root", str(store.root), "--json", "recover")
    assert json.loads(r.out)["recovered"]["release"] == "x" and store.state()["pending"] is None


def _wait_for_staging(store: DeviceStore, proc: subprocess.Popen[str], timeout: float = 60) -> list[Path]:
    """Bounded wait until the running deploy has started writing releases/.tmp-<release>."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        leftovers = list(store.releases.glob(".tmp-*"))
        if leftovers and any(leftovers[0].iterdir()):
            return leftovers
        time.sleep(0.005)
    return []


def test_agent_killed_while_staging_is_cleaned_up_by_recovery(store: DeviceStore, tmp_path: Path) -> None:
    """A real agent killed mid-unpack (as when its SSH session dies) leaves .tmp-<release>; recovery removes it."""
    from tests.helpers import BIN, agent

    b1 = make_bundle(tmp_path / "v1", version="1")
    Deployment(store, ScriptedService(store)).deploy(copy(b1, store.incoming), timeout=2)
    old = read_manifest(b1).release_name
    big = make_bundle(tmp_path / "v2", version="2", lib_bytes=os.urandom(48 << 20))  # unpacking takes a while
    proc = subprocess.Popen(
        [str(BIN / "edgedeploy-agent"), "--root", str(store.root), "--json", "deploy", str(copy(big, store.incoming))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    leftovers = _wait_for_staging(store, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert leftovers and all(p.exists() for p in leftovers), "the deploy finished before it could be killed"
    assert store.state()["pending"]["state"] == "staged"

    r = agent("--root", str(store.root), "--json", "recover")  # what the next deploy (or the host) does first
    assert r.code == 0, r.err
    assert not list(store.releases.glob(".tmp-*"))
    state = store.state()
    assert state["pending"] is None and state["current"] == old and store.current() == old
    assert leftovers[0].name in state["history"][-1]["detail"]


def test_recovery_removes_staging_leftovers_even_without_a_pending_transition(store: DeviceStore) -> None:
    leftover = store.releases / ".tmp-toy-2-0123456789abcdef"
    leftover.mkdir()
    (leftover / "model.so").write_bytes(b"half")
    kept = store.releases / "toy-1-0123456789abcdef"
    kept.mkdir()
    assert recover(store, ScriptedService(store)) is None
    assert not leftover.exists() and kept.is_dir()


class KilledAtRestart(ScriptedService):
    """Kills its own process (SIGKILL: no `finally`, no handler runs) when asked to start `release`."""

    def __init__(self, store: DeviceStore, release: str) -> None:
        super().__init__(store)
        self.release = release

    def restart(self) -> None:
        if self.store.current() == self.release:
            os.kill(os.getpid(), signal.SIGKILL)
        super().restart()


def test_agent_killed_mid_rollback_is_recovered_like_a_deploy(store: DeviceStore, tmp_path: Path) -> None:
    """The rollback runs in a child process killed once `current` points at the older release; recovery
    puts the device back on the release state.json last committed, and says what it interrupted."""
    svc = ScriptedService(store)
    names = []
    for v in ("1", "2"):
        b = make_bundle(tmp_path / v, version=v, lib_bytes=v.encode())
        names.append(read_manifest(b).release_name)
        Deployment(store, svc).deploy(copy(b, store.incoming), timeout=2)
    pid = os.fork()
    if pid == 0:  # the agent process
        try:
            rollback(store, KilledAtRestart(store, names[0]), timeout=2)
        finally:
            os._exit(1)  # only reached when the kill did not happen
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert store.current() == names[0]  # killed after the link swap
    assert store.state()["pending"]["kind"] == "rollback" and store.state()["current"] == names[1]

    assert recover(store, svc) == names[1]
    state = store.state()
    assert store.current() == state["current"] == names[1] and state["previous"] == [names[0]]
    assert state["pending"] is None and state["history"][-1]["event"] == "recovered" and svc.running
    assert rollback(store, svc, timeout=2)["release"] == names[0]  # and a rollback still works after it


def test_the_finishers_timer_finds_nothing_to_do_while_a_deploy_runs(store: DeviceStore) -> None:
    """`recover --finish` runs every minute under systemd (edgedeploy-agent-finish.timer): with no transition cut
    off it answers at once and exits 0, also while a deploy holds the device lock (it must not fail every minute
    of a long engine build)."""
    from tests.helpers import agent

    idle = agent("--root", str(store.root), "--json", "recover", "--finish")
    assert idle.code == 0 and json.loads(idle.out)["finished"] is None, idle.err
    with store.exclusive("deploy"):
        busy = agent("--root", str(store.root), "--json", "recover", "--finish")
    assert busy.code == 0 and json.loads(busy.out)["finished"] is None, busy.out + busy.err
