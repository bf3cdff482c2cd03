"""Rollouts to several real devices (sshd in network namespaces) under injected faults.

After every fault the device runs its old or its new bundle, never neither, and the host's report
says which. Every fault is injected once and undone by the test itself: no loop runs unbounded.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from tests.agent.bundles import make_bundle
from tests.helpers import Cli, assert_one_line_error, mount_tmpfs, require_sshd
from tests.integration.netfleet import NetFleet, net_fleet, padded_bundle

pytestmark = [pytest.mark.integration, pytest.mark.sshd, pytest.mark.netns]


@pytest.fixture
def fleet(cli: Cli, tmp_path: Path, mnist_bundle: Path, netns: None) -> Iterator[NetFleet]:
    require_sshd()
    with net_fleet(cli, tmp_path, ["cam-a", "cam-b", "cam-c"], first_index=11) as f:
        code, first = f.rollout(str(mnist_bundle), "--group", "lab", "--canary", "1", "--concurrency", "3")
        assert code == 0, first
        yield f


def test_dry_run_then_rollout_then_repush_moves_nothing(
    fleet: NetFleet, mnist_bundle: Path, tmp_path: Path, hermetic: Path
) -> None:
    v2 = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 1 << 20, version="9")
    r = fleet.cli("rollout", str(v2), "--group", "lab", "--canary", "1", "--wave", "50%", "--dry-run", *fleet.args())
    assert r.code == 0, r.err
    assert "canary" in r.out and "wave 1" in r.out and "cam-a" in r.out, r.out
    assert all(d.current() == read_manifest(mnist_bundle).release_name for d in fleet.devices.values())  # dry run

    code, res = fleet.rollout(str(v2), "--group", "lab", "--canary", "1", "--wave", "1")
    assert code == 0 and res["status"] == "done" and res["succeeded"] == ["cam-a", "cam-b", "cam-c"], res
    assert res["waves"] == [["cam-a"], ["cam-b"], ["cam-c"]]
    new = read_manifest(v2).release_name
    assert all(d.current() == new and res["devices"][n]["release_after"] == new for n, d in fleet.devices.items())
    # the model library was already on the devices: only the manifest and the new blob moved
    assert "sent 1.0" in res["devices"]["cam-b"]["detail"], res["devices"]["cam-b"]

    r = fleet.cli("push", "cam-a", str(v2), "--force", "--json", *fleet.args())
    assert r.code == 0 and json.loads(r.out)["uploaded_bytes"] == 0, r.err  # re-push: nothing to send
    log = (hermetic / "state" / "logs" / "devices" / "cam-b.log").read_text()
    assert "committed" in log and read_manifest(v2).release_name in log
    r = fleet.cli("rollback", "--group", "lab", "--json", *fleet.args())
    assert r.code == 0, r.out + r.err
    assert all(d.current() == read_manifest(mnist_bundle).release_name for d in fleet.devices.values())


def test_agent_crashing_on_load_halts_at_the_canary(fleet: NetFleet, mnist_bundle: Path, tmp_path: Path) -> None:
    broken = make_bundle(tmp_path / "broken", version="2", lib_bytes=b"\x7fELF but not a library")
    code, res = fleet.rollout(str(broken), "--group", "lab", "--canary", "1")
    assert code == 1 and res["status"] == "halted", res
    canary = res["devices"]["cam-a"]
    assert canary["status"] == "failed" and canary["code"] == "health-check-failed", canary
    good = read_manifest(mnist_bundle).release_name
    assert canary["release_after"] == good and fleet.devices["cam-a"].current() == good  # rolled back by itself
    for name in ("cam-b", "cam-c"):  # never touched
        assert res["devices"][name]["status"] == "skipped" and fleet.devices[name].current() == good


def test_sshd_killed_then_resume(fleet: NetFleet, mnist_bundle: Path, tmp_path: Path) -> None:
    v2 = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="9")
    fleet.devices["cam-b"].sshd.kill()
    code, res = fleet.rollout(str(v2), "--group", "lab", "--canary", "1", "--max-fail", "50%")
    assert code == 5 and res["failed"] == ["cam-b"], res
    assert res["devices"]["cam-b"]["code"] == "ConnectionFailed" and res["devices"]["cam-b"]["release_after"] is None
    old, new = read_manifest(mnist_bundle).release_name, read_manifest(v2).release_name
    assert fleet.devices["cam-b"].current() == old and fleet.devices["cam-c"].current() == new
    fleet.devices["cam-b"].sshd.start()  # same host key: the device is back
    r = fleet.cli("rollout", "--resume", "--json", *fleet.args())
    assert r.code == 0, r.out + r.err
    assert json.loads(r.out)["devices"]["cam-b"]["status"] == "committed"
    assert fleet.devices["cam-b"].current() == new


def test_changed_host_key_and_dead_address(fleet: NetFleet, mnist_bundle: Path, tmp_path: Path) -> None:
    dev = fleet.devices["cam-c"]
    dev.sshd.kill()
    dev.sshd.host_key.unlink()
    dev.sshd.host_key.with_suffix(".pub").unlink()
    dev.sshd.start()  # a reinstalled device: new host key
    r = fleet.cli(
        "devices", "add", "ghost", "--host", f"10.77.{dev.link.index}.9", "--port", "2222",
        "--profile", "cpu-x86_64", "--tags", "lab", "--service", "process", *fleet.args(),
    )  # fmt: skip
    assert r.code == 0, r.err
    v2 = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="9")
    t = time.monotonic()
    code, res = fleet.rollout(str(v2), "--group", "lab", "--canary", "0", "--max-fail", "50%", "--connect-timeout", "2")
    assert time.monotonic() - t < 120
    assert code == 5 and res["failed"] == ["cam-c", "ghost"], res
    assert res["devices"]["cam-c"]["code"] == "host-key" and "HOST KEY CHANGED" in res["devices"]["cam-c"]["detail"]
    assert res["devices"]["ghost"]["code"] == "ConnectionFailed"
    assert dev.current() == read_manifest(mnist_bundle).release_name  # untouched, still on the old bundle
    assert fleet.devices["cam-a"].current() == read_manifest(v2).release_name


def test_link_down_mid_upload_then_resume(fleet: NetFleet, mnist_bundle: Path, tmp_path: Path) -> None:
    big = padded_bundle(mnist_bundle, tmp_path / "big.edb", 96 << 20, version="10")
    dev = fleet.devices["cam-a"]
    incoming = dev.root / "blobs" / "incoming"
    cut: dict[str, int] = {}

    def part_size() -> int:
        for part in incoming.glob("*.part"):
            try:
                return part.stat().st_size
            except FileNotFoundError:  # renamed since the glob: the upload finished
                pass
        return 0

    def cut_link() -> None:  # bounded: gives up after 60 s
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            size = part_size()
            if size > (8 << 20):
                dev.link.set_link(False)
                cut["at"] = size
                return
            time.sleep(0.01)

    # 200 Mbit/s: the 96 MB take ~4 s. At loopback speed a loaded 2-core machine let the whole upload pass (and
    # its .part be renamed) between two polls, and the test failed with "the upload finished ..."
    dev.link.set_rate(200)
    watcher = threading.Thread(target=cut_link)
    watcher.start()
    r = fleet.cli("push", "cam-a", str(big), "--io-timeout", "3", *fleet.args())
    watcher.join()
    dev.link.set_link(True)
    dev.link.set_rate(None)
    assert "at" in cut, "the upload finished before the link could be cut"
    assert_one_line_error(r, 3, "upload")
    assert dev.current() == read_manifest(mnist_bundle).release_name  # the old bundle runs on
    part = next(incoming.glob("*.part"))
    assert part.stat().st_size >= cut["at"] // 2  # a prefix survived, and the agent never read it
    r = fleet.cli("push", "cam-a", str(big), "--json", *fleet.args())
    assert r.code == 0, r.err
    res = json.loads(r.out)
    assert res["outcome"] == "committed" and dev.current() == read_manifest(big).release_name
    assert res["uploaded_bytes"] == (96 << 20)  # the blob counts whole; the bytes resumed from the .part
    assert not list(incoming.glob("*.part"))


def test_small_disk_refuses_before_upload(cli: Cli, tmp_path: Path, mnist_bundle: Path, netns: None) -> None:
    require_sshd()
    root = tmp_path / "small"
    root.mkdir()
    mount_tmpfs(root, "40m")
    try:
        fleet = NetFleet(cli, tmp_path, tmp_path / "fleet" / "devices.toml")
        try:
            fleet.add("cam-s", 19, f"s{int(time.time()) % 1000}", root=root / "agent")
            code, res = fleet.rollout(str(mnist_bundle), "--devices", "cam-s")
            assert code == 0, res
            big = padded_bundle(mnist_bundle, tmp_path / "big.edb", 24 << 20, version="11")
            code, res = fleet.rollout(str(big), "--devices", "cam-s")
            assert code == 1 and res["devices"]["cam-s"]["code"] == "no-space", res
            assert fleet.devices["cam-s"].current() == read_manifest(mnist_bundle).release_name
            assert not list((root / "agent" / "blobs" / "incoming").iterdir())
        finally:
            fleet.close()
    finally:
        subprocess.run(["umount", "-l", str(root)])
        shutil.rmtree(root, ignore_errors=True)


def test_interrupted_rollout_is_shown_and_resumed(fleet: NetFleet, mnist_bundle: Path, tmp_path: Path) -> None:
    v2 = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="9")
    state_dir = tmp_path / "host" / "state" / "rollouts"
    before = set(state_dir.glob("*.json"))
    proc = subprocess.Popen(
        [str(fleet.cli_bin), "rollout", str(v2), "--group", "lab", "--canary", "0", "--concurrency", "1",
         *fleet.args()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    state: dict = {}
    while time.monotonic() < deadline and proc.poll() is None:  # bounded: interrupt after the first device
        new = set(state_dir.glob("*.json")) - before
        if new:
            state = json.loads(next(iter(new)).read_text())
            if state["succeeded"]:
                proc.send_signal(signal.SIGINT)
                break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err, err
    state = json.loads(next(iter(set(state_dir.glob("*.json")) - before)).read_text())
    assert state["status"] == "interrupted" and state["untouched"], state
    new = read_manifest(v2).release_name
    for name, d in state["devices"].items():  # the state file says what each device runs
        expected = new if d["status"] == "committed" else read_manifest(mnist_bundle).release_name
        assert fleet.devices[name].current() == expected
    r = fleet.cli("rollout", "--show", *fleet.args())
    assert r.code == 5 and "interrupted" in r.out and "rollout --resume" in r.err, r.out + r.err
    r = fleet.cli("rollout", "--resume", "--json", *fleet.args())
    assert r.code == 0, r.out + r.err
    assert all(d.current() == new for d in fleet.devices.values())


def test_sshd_killed_mid_deploy_recovers_to_the_old_bundle(fleet: NetFleet, mnist_bundle: Path, tmp_path: Path) -> None:
    """Like a device losing power while its health check runs: the next contact puts it back."""
    v2 = padded_bundle(mnist_bundle, tmp_path / "v2.edb", 4096, version="9")
    dev = fleet.devices["cam-a"]
    # no frame source on these devices: 10**6 inferences never come, so the deploy waits in health-check
    proc = subprocess.Popen(
        [str(fleet.cli_bin), "push", "cam-a", str(v2), "--min-inferences", "1000000", "--timeout", "60",
         *fleet.args()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # bounded wait for the device to be mid-transition
        pending = json.loads((dev.root / "models" / "default" / "state.json").read_text()).get("pending") or {}
        if pending.get("state") == "health-check":
            break
        time.sleep(0.05)
    assert pending.get("state") == "health-check", pending
    dev.sshd.kill()  # the deploy command and its session die with it
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "connection lost" in err, err
    dev.sshd.start()
    r = fleet.cli("devices", "facts", "cam-a", "--json", *fleet.args())  # facts report it, change nothing
    assert r.code == 0, r.err
    facts = json.loads(r.out)
    old = read_manifest(mnist_bundle).release_name
    assert facts["current_release"] == old and facts["pending_state"] == "health-check"
    r = fleet.cli("push", "cam-a", str(mnist_bundle), *fleet.args())  # the next deploy recovers first
    assert r.code == 0, r.err
    state = json.loads((dev.root / "models" / "default" / "state.json").read_text())
    assert dev.current() == old and state["pending"] is None
    assert "recovered" in [h["event"] for h in state["history"]]
