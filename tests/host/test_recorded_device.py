"""What the host sends a device, recorded without sshd or an agent (tests/host/doubles.py RecordingTransport):
the push executor, manual and automatic rollback, a rollout that halts at its canary, and `agent install`.
Every command is an argv list in the order the device must see it; values from the inventory are words of their
own, never spliced into a shell string."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest

from edgedeploy.cuda_backend import LIBRARY
from edgedeploy.errors import DeviceError
from edgedeploy.inventory import Device, Inventory
from edgedeploy.remote import device_ops, install_run, rollout_runner
from edgedeploy.remote.blobs import bundle_blobs
from edgedeploy.remote.execute import PushOptions, push, rollback
from edgedeploy.remote.install import PROBE, SUDOERS_PATH, UNIT_PATH, InstallOptions
from edgedeploy.remote.plan import HealthPolicy
from edgedeploy.remote.rollout import Waves
from edgedeploy.remote.wheels import CUDA_BACKEND_DIR
from tests.agent.bundles import make_bundle
from tests.host.doubles import FACTS, Put, RecordingTransport, agent_failed, agent_ok, connect_to, replied

# inventory values a shell would read as commands: they must reach the device as single argv words
ROOT = "/srv/edge deploy;touch pwned"
SOURCE = "file:/data/a b $(reboot).mp4"
DEV = Device(name="cam-01", host="10.0.0.5", profile="cpu-x86_64", root=ROOT, source=SOURCE)
AGENT = (DEV.agent_command, "--root", ROOT, "--json")


def facts(missing: list[str] | None = None, **over: Any) -> dict[str, Any]:
    """The agent's facts (captured, tests/host/doubles.py) as a device running release toy-1-abc says them."""
    blobs = None if missing is None else {"missing": missing, "partial": {}, "free_bytes": 1 << 30}
    return {**{k: v for k, v in FACTS.items() if k != "ok"}, "bundle_schema": 3, "root": ROOT, "blobs": blobs, **over}


def test_a_push_checks_uploads_then_deploys_with_argv_words(tmp_path: Path) -> None:
    blobs = bundle_blobs(make_bundle(tmp_path / "b", version="2"))
    release = blobs.manifest.release_name
    shas = [b.sha256 for b in blobs.blobs]
    t = RecordingTransport()
    t.on("facts", agent_ok(**facts(missing=shas)))
    t.on("deploy", agent_ok(outcome="committed", release=release, previous="toy-1-abc", timings={"verify_s": 0.1}))

    r = push(t, DEV, blobs, PushOptions(health=HealthPolicy(timeout=5, min_inferences=3)))

    assert (r.outcome, r.release, r.previous) == ("committed", release, "toy-1-abc")
    assert r.uploaded_bytes == blobs.total_bytes and r.timings["device_verify_s"] == 0.1
    facts_argv, deploy_argv = t.runs
    assert facts_argv == (*AGENT, "facts", "--blobs", *shas)
    assert deploy_argv == (
        *AGENT, "deploy", "--manifest-blob", blobs.manifest_sha, "--timeout", "5", "--min-inferences", "3",
        "--source", SOURCE,
    )  # fmt: skip
    # the order the device sees: facts, every missing blob into incoming/ (complete or not at all), then deploy
    kinds = ["put" if isinstance(e, Put) else e.argv[4] for e in t.log]
    assert kinds == ["facts", *["put"] * len(shas), "deploy"]
    assert [(p.remote, p.size) for p in t.puts] == [(f"{ROOT}/blobs/incoming/{b.sha256}", b.size) for b in blobs.blobs]
    assert not any(a[:2] == ("sh", "-c") for a in t.runs)  # a push runs no shell at all


def test_a_push_sends_only_the_missing_blobs_and_nothing_for_the_running_release(tmp_path: Path) -> None:
    blobs = bundle_blobs(make_bundle(tmp_path / "b", version="2"))
    library = next(b for b in blobs.blobs if b.label == "model.so")
    t = RecordingTransport().on("facts", agent_ok(**facts(missing=[library.sha256])))
    t.on("deploy", agent_ok(outcome="committed", release=blobs.manifest.release_name))
    push(t, DEV, blobs)
    assert [p.remote.rsplit("/", 1)[1] for p in t.puts] == [library.sha256]

    running = {"release": blobs.manifest.release_name}
    healthy = {**FACTS["health"], "release": blobs.manifest.release_name}  # type: ignore[dict-item]
    again = RecordingTransport().on("facts", agent_ok(**facts(missing=[], current=running, health=healthy)))
    assert push(again, DEV, blobs).outcome == "unchanged"
    assert [a[4] for a in again.runs] == ["facts"] and not again.puts


def test_a_failed_health_check_is_rolled_back_on_the_device_and_said_so(tmp_path: Path) -> None:
    """The deploy's health check is the agent's (it rolls back before it answers): the host sends nothing after
    the failed deploy, and its error says the device went back."""
    blobs = bundle_blobs(make_bundle(tmp_path / "b", version="2"))
    t = RecordingTransport().on("facts", agent_ok(**facts(missing=[])))
    t.on("deploy", agent_failed("health-check-failed", "toy-2 failed its health check: no frames in 5 s"))
    with pytest.raises(DeviceError) as e:
        push(t, DEV, blobs)
    assert e.value.message == "cam-01: toy-2 failed its health check: no frames in 5 s (rolled back automatically)"
    assert e.value.code == "health-check-failed"
    assert [a[4] for a in t.runs] == ["facts", "deploy"]


def test_an_agent_killed_mid_deploy_is_recovered_then_read_back(tmp_path: Path) -> None:
    blobs = bundle_blobs(make_bundle(tmp_path / "b", version="2"))
    t = RecordingTransport().on("facts", agent_ok(**facts(missing=[])), agent_ok(**facts()))
    t.on("deploy", replied(exit_code=-9, stderr="Killed"))
    t.on("recover", agent_ok(recovered="rolled back"))
    with pytest.raises(DeviceError) as e:
        push(t, DEV, blobs)
    assert "killed on the device while running `deploy`" in e.value.message and e.value.code == "agent-killed"
    assert e.value.message.endswith("read back: the device is on toy-1-abc (agent ready)")
    assert [a[4] for a in t.runs] == ["facts", "deploy", "recover", "facts"]


def test_manual_rollback_is_one_agent_call_with_its_timeout() -> None:
    t = RecordingTransport().on("rollback", agent_ok(release="toy-1-abc", previous="toy-2-def"))
    assert rollback(t, DEV, timeout=30)["release"] == "toy-1-abc"
    assert t.log == [t.log[0]] and t.runs == [(*AGENT, "rollback", "--timeout", "30")]
    assert t.log[0].timeout == 30 * 2 + 60  # type: ignore[union-attr]


def test_fleet_rollback_logs_each_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hermetic: Path) -> None:
    inv = Inventory(tmp_path / "devices.toml", {})
    inv.add(DEV)
    t = RecordingTransport().on("rollback", agent_ok(release="toy-1-abc", previous="toy-2-def"))
    connect_to(monkeypatch, t, device_ops)
    result = device_ops.rollback_fleet(inv, ["cam-01"])
    assert result.succeeded["cam-01"]["release"] == "toy-1-abc" and not result.failed
    log = (hermetic / "state" / "logs" / "devices" / "cam-01.log").read_text()
    assert "manual rollback to toy-1-abc (was toy-2-def)" in log


def test_a_rollout_whose_canary_fails_its_health_check_halts_and_reads_the_release_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canary's deploy fails its health check (the agent rolled it back): the rollout records the failure
    with the release the canary runs after it (read back), halts, and never contacts the other device."""
    inv = Inventory(tmp_path / "devices.toml", {})
    for name in ("cam-01", "cam-02"):
        inv.add(DEV.model_copy(update={"name": name}))
    bundle = make_bundle(tmp_path / "b", version="2")
    t = RecordingTransport().on("facts", agent_ok(**facts(missing=[])), agent_ok(**facts()))
    t.on("deploy", agent_failed("health-check-failed", "toy-2 failed its health check"))
    connect_to(monkeypatch, t, rollout_runner)
    state = rollout_runner.rollout(inv, bundle, ["cam-01", "cam-02"], Waves(canary=1), concurrency=1)
    assert state.status == "halted" and "canary" in (state.halted_reason or "")
    canary, other = state.devices["cam-01"], state.devices["cam-02"]
    assert (canary.status, canary.code, canary.release_after) == ("failed", "health-check-failed", "toy-1-abc")
    assert "rolled back automatically" in canary.detail
    assert (other.status, other.detail) == ("skipped", "not started: rollout halted (canary device failed (1 failed))")
    assert [a[4] for a in t.runs] == ["facts", "deploy", "facts"]  # push, then the read-back; cam-02 untouched


# --- agent install ---


def _wheelhouse(folder: Path) -> Path:
    """The agent's wheel, and a CUDA backend for aarch64 devices (so that nothing is built here)."""
    folder.mkdir()
    with zipfile.ZipFile(folder / "edgedeploy-0.1.0-py3-none-any.whl", "w") as z:
        z.writestr("edgedeploy_agent/__init__.py", "__version__ = '0.1.0'\n")
    backend = folder / CUDA_BACKEND_DIR / "aarch64" / LIBRARY
    backend.parent.mkdir(parents=True)
    backend.write_bytes(b"an aarch64 CUDA backend")
    return folder


def test_agent_install_as_a_non_root_login_runs_root_steps_through_sudo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh Jetson reached as `deploy` (uid 1000), systemd mode: one probe (a fixed script, the values as its
    $1..$8), then every planned step in order, root ones as `sudo -n ARGV`, root uploads to /tmp and moved
    into place by `sudo -n install`, the health check as the service user; the inventory is pointed at the venv."""
    runtime = tmp_path / "libtvm_runtime.so"
    runtime.write_bytes(b"an aarch64 runtime")
    dev = DEV.model_copy(update={"user": "deploy", "service": "systemd", "profile": "xavier-agx"})
    inv = Inventory(tmp_path / "devices.toml", {})
    inv.add(dev)
    venv = "/opt/edge deploy/venv"
    options = InstallOptions(
        python="python3.9", venv=venv, wheelhouse=_wheelhouse(tmp_path / "wh"), runtime_lib=runtime
    )
    probe = "uid=1000\narch=aarch64\npython=3.9\nsystemctl=1\njetson=# R35 (release), REVISION: 4.1\n"
    t = RecordingTransport().on(lambda a: a[:2] == ("sh", "-c"), replied(probe))
    t.on("facts", agent_ok(**facts(root=ROOT)))
    t.on(lambda a: a[-2:] == ("-c", install_run.OPENCV_PROBE), replied("4.5.4 gstreamer\n"))
    t.on(lambda a: True, replied())  # every planned step succeeds
    connect_to(monkeypatch, t, install_run)

    res = install_run.install_agent(inv, "cam-01", options)

    assert res["healthy"] and res["agent_command"] == f"{venv}/bin/edgedeploy-agent"
    assert Inventory.load(inv.path).get("cam-01").agent_command == f"{venv}/bin/edgedeploy-agent"
    first, *steps = t.runs
    # the probe's arguments: the last one names the model slots besides default (none here)
    assert first == ("sh", "-c", PROBE, "sh", "python3.9", venv, ROOT, "edgedeploy", UNIT_PATH,
                     ".edgedeploy-install", "deploy", SUDOERS_PATH, "/usr/bin/python3.8",
                     f"{venv}-system", "")  # fmt: skip
    *planned, health, opencv = steps
    assert health == (
        "sudo",
        "-n",
        "-u",
        "edgedeploy",
        f"{venv}/bin/edgedeploy-agent",
        "--root",
        ROOT,
        "--json",
        "facts",
    )
    assert opencv[0] == f"{venv}/bin/python"
    assert all(a[:2] == ("sudo", "-n") for a in planned)  # systemd mode: every step is root's
    assert planned[0] == ("sudo", "-n", "useradd", "--system", "--user-group", "--groups", "video", "--home-dir", ROOT,
                          "--no-create-home", "--shell", "/usr/sbin/nologin", "edgedeploy")  # fmt: skip
    assert ("sudo", "-n", "mkdir", "-p", venv) in planned and (
        "sudo",
        "-n",
        "visudo",
        "-cf",
        "/tmp/edgedeploy-sudoers",
    ) in planned
    # root uploads go to /tmp as the login, then `install` moves each into place
    uploads = [p.remote for p in t.puts]
    assert f"/tmp/edgedeploy-install-{Path(UNIT_PATH).name}" in uploads and "/tmp/edgedeploy-sudoers" in uploads
    assert (
        "sudo",
        "-n",
        "install",
        "-m",
        "0644",
        f"/tmp/edgedeploy-install-{Path(UNIT_PATH).name}",
        UNIT_PATH,
    ) in planned
    # the wheelhouse's CUDA backend for the device's architecture goes into the agent root the same way
    moved = ("sudo", "-n", "install", "-m", "0644", f"/tmp/edgedeploy-install-{LIBRARY}", f"{ROOT}/lib/{LIBRARY}")
    assert moved in planned
    # shell steps take the values as arguments: the scripts are constants, never built from input
    scripts = {a[a.index("-c") + 1] for a in planned if "-c" in a and a[a.index("-c") - 1] == "sh"}
    assert scripts and not any(ROOT in s or venv in s for s in scripts)
    assert res["changed"][-1] == "enable unit" and "restart agent" not in res["changed"]  # no release yet


def test_a_failed_install_step_stops_the_install_with_its_command_as_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = DEV.model_copy(update={"user": "root", "service": "process"})
    inv = Inventory(tmp_path / "devices.toml", {})
    inv.add(dev)
    options = InstallOptions(venv="/opt/v", wheelhouse=_wheelhouse(tmp_path / "wh"), runtime_lib=None)
    t = RecordingTransport().on(lambda a: a[:2] == ("sh", "-c"), replied("uid=0\narch=aarch64\npython=3.11\n"))
    t.on(lambda a: a[1:3] == ("-m", "venv"), replied(exit_code=1, stderr="ensurepip is not available"))
    t.on(lambda a: True, replied())
    connect_to(monkeypatch, t, install_run)
    with pytest.raises(DeviceError, match="install step 'create venv' failed \\(exit 1\\): ensurepip") as e:
        install_run.install_agent(inv, "cam-01", options)
    assert e.value.hint == "python3 -m venv /opt/v"
    assert t.runs[-1] == ("python3", "-m", "venv", "/opt/v")  # nothing ran after the failed step
