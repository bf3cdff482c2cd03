"""The real agent on a Jetson-like arm64 userland, as a systemd service, deployed to over real SSH.

A Debian bullseye arm64 root (glibc 2.31, Python 3.9, systemd 247 as PID 1) runs in systemd-nspawn under
QEMU user-mode emulation (tests/integration/arm64root.py). `edgedeploy agent install` sets it up in systemd
mode through a non-root login with a bootstrap sudo grant, which is then taken away: from there on the
login has only the installer's sudoers rule, and pushes the INT8 bundles built here for `xavier-cpu`.

The tests run in file order on one container (emulation is slow: one boot, one install, few frames).
Emulation stands in for one thing only: qemu-user 7.2 shows the x86 host's /proc/cpuinfo, so the container
and the agent's unit see an AGX Xavier's instead (tests/agent/fixtures/cpuinfo-carmel.txt).
"""

from __future__ import annotations

import gzip
import json
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from edgedeploy.fleet_servers import servers_available
from edgedeploy.localdevice import free_port
from edgedeploy_agent.bundle import extract_bundle, read_manifest
from edgedeploy_agent.loop import top_k
from edgedeploy_agent.preprocess import preprocess
from edgedeploy_agent.runtime import load_runtime
from edgedeploy_agent.unit import FINISH_UNIT, RESTART_UNIT, WATCH_UNIT
from tests.agent.bundles import with_version
from tests.helpers import BIN, Cli, keep_user_files_out, looped, require, wait_for
from tests.integration.arm64root import (
    FRAMES,
    LOGIN,
    UNIT,
    VENV,
    Container,
    PreparedRoot,
    set_up_disk,
)
from tests.integration.bundles import crashing_on_real_frames
from tests.integration.pullfleet import PUBLISHER, PullFleet, start_pull_fleet

pytestmark = [pytest.mark.integration, pytest.mark.compile]
in_container = pytest.mark.arm64  # checked through require(): tests/conftest.py NEEDS (ARM64_SYSTEMD)

ROOT = "/var/lib/edgedeploy"
DIGITS, PHOTOS = 6, 6  # frames: MNIST test digits, then ImageNet sample photos (bounded: emulation is slow)
TIMINGS: dict[str, float] = {}


def timed(name: str, fn: Callable[[], Any]) -> Any:
    t = time.monotonic()
    try:
        return fn()
    finally:
        TIMINGS[name] = round(time.monotonic() - t, 1)


# --- what the device plays: lossless frames, so both decoders see the same pixels ------------------


@pytest.fixture(scope="module")
def frames_video(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with gzip.open(data_dir / "mnist" / "t10k-images-idx3-ubyte.gz") as f:
        digits = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:DIGITS]
    frames = [
        cv2.cvtColor(cv2.resize(d, (224, 224), interpolation=cv2.INTER_NEAREST), cv2.COLOR_GRAY2BGR) for d in digits
    ]
    for p in sorted((data_dir / "imagenet-sample").glob("*.jpg"))[:PHOTOS]:
        frames.append(cv2.resize(cv2.imread(str(p)), (224, 224), interpolation=cv2.INTER_AREA))
    path = tmp_path_factory.mktemp("arm64-frames") / "frames.avi"
    w = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"FFV1"), 5.0, (224, 224))
    for fr in frames:
        w.write(fr)
    w.release()
    return path


def decoded(video: Path) -> list[np.ndarray]:
    cap, out = cv2.VideoCapture(str(video)), []
    while True:
        ok, frame = cap.read()
        if not ok:
            cap.release()
            return out
        out.append(frame)


# --- the bundles: INT8 for the Jetson CPU and, as the reference, for x86 ---------------------------


def build_int8(cli: Cli, data_dir: Path, out: Path, model: str, profile: str, calibration: str) -> Path:
    r = cli(
        "build", str(data_dir / "models" / model), "-p", profile, "--int8", "--calibration",
        str(data_dir / calibration), "--samples", "32", "-o", str(out), timeout=900,
    )  # fmt: skip
    assert r.code == 0, r.err
    return out


MODELS = {"mnist": ("mnist-8_opset13.onnx", "mnist"), "mobilenet": ("mobilenet_v1_0.25_224.onnx", "imagenet-sample")}


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> Iterator[None]:
    """The module's fixtures run before each test's `hermetic`: keep the user's config, state and cache out."""
    with pytest.MonkeyPatch.context() as mp:
        keep_user_files_out(mp, tmp_path_factory.mktemp("arm64-host"), build_cache)
        yield


@pytest.fixture(scope="module")
def bundles(module_env: None, data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """{mnist, mobilenet} x {xavier-cpu, cpu-x86_64} INT8 bundles, built once (session build cache)."""
    out, cli, built = tmp_path_factory.mktemp("arm64-bundles"), Cli(), {}
    for name, (model, calibration) in MODELS.items():
        for profile in ("xavier-cpu", "cpu-x86_64"):
            t = time.monotonic()
            built[f"{name}-{profile}"] = build_int8(
                cli, data_dir, out / f"{name}-{profile}.edb", model, profile, calibration
            )
            TIMINGS[f"build {name} {profile}"] = round(time.monotonic() - t, 1)
    return built


def test_the_jetson_cpu_int8_libraries_have_no_dot_product_and_need_glibc_2_31(
    bundles: dict[str, Path], tmp_path: Path
) -> None:
    """Carmel has no sdot/udot (asimddp): they would be SIGILL there. The build checked the glibc needs; check
    them again with binutils, and the instructions with its disassembler."""
    missing = "binutils-aarch64-linux-gnu not installed (containers/install-build-deps.sh installs it)"
    require("CROSS_TOOLCHAIN", missing if shutil.which("aarch64-linux-gnu-objdump") is None else None)
    for name in ("mnist", "mobilenet"):
        m = extract_bundle(bundles[f"{name}-xavier-cpu"], tmp_path / name)
        so = tmp_path / name / next(a.path for a in m.artifacts if a.role == "tvm-library")
        dynamic = subprocess.run(["aarch64-linux-gnu-objdump", "-T", str(so)], capture_output=True, text=True).stdout
        versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_([0-9.]+)", dynamic)}
        assert versions and max(versions) <= (2, 31), versions
        code = subprocess.run(["aarch64-linux-gnu-objdump", "-d", str(so)], capture_output=True, text=True).stdout
        mnemonics = re.findall(r"^\s*[0-9a-f]+:\s+[0-9a-f]{8}\s+(\S+)", code, re.M)
        assert len(mnemonics) > 1000 and "fmla" in mnemonics  # NEON float32 multiply-adds: the exact INT8 path
        assert not {"sdot", "udot", "usdot"} & set(mnemonics)


# --- the device ---------------------------------------------------------------------------------------


@dataclass
class ArmDevice:
    container: Container
    prepared: PreparedRoot
    inventory: Path
    key: Path
    install: dict[str, Any]
    name: str = "xavier-emu"
    releases: dict[str, str] = field(default_factory=dict)

    def args(self) -> list[str]:
        return ["--inventory", str(self.inventory)]

    def ssh(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A command over real SSH as the deploying login, host key pinned (the inventory's known_hosts)."""
        opts = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "StrictHostKeyChecking=yes"]
        opts += ["-o", f"UserKnownHostsFile={self.inventory.parent / 'known_hosts'}", "-i", str(self.key)]
        cmd = ["ssh", *opts, "-p", str(self.container.port), f"{LOGIN}@127.0.0.1", "--", shlex.join(argv)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def unit(self, name: str = UNIT) -> dict[str, str]:
        props = "ActiveState,SubState,MainPID,NRestarts,StatusText,Result,WatchdogTimestampMonotonic,WatchdogUSec"
        out = self.container.exec(["systemctl", "show", name, "-p", props]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def facts(self, cli: Cli) -> dict[str, Any]:
        r = cli("devices", "facts", self.name, "--json", *self.args(), timeout=300)
        assert r.code == 0, r.err
        return dict(json.loads(r.out))

    def set_source(self, cli: Cli, source: str) -> None:
        r = cli(
            "devices", "add", self.name, "--host", "127.0.0.1", "--port", str(self.container.port), "--user", LOGIN,
            "--key-file", str(self.key), "--profile", "xavier-cpu", "--root", ROOT, "--service", "systemd",
            "--agent-command", f"{VENV}/bin/edgedeploy-agent", "--source", source, "--replace", *self.args(),
        )  # fmt: skip
        assert r.code == 0, r.err


@pytest.fixture(scope="module")
def arm(
    module_env: None,
    request: pytest.FixtureRequest,
    arm64_root: PreparedRoot,
    tmp_path_factory: pytest.TempPathFactory,
    frames_video: Path,
    bundles: dict[str, Path],
) -> Iterator[ArmDevice]:
    work = tmp_path_factory.mktemp("arm64-device")
    key = work / "deploy_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    c = Container(arm64_root.root, work / "disk", free_port())
    c.mount()
    try:
        set_up_disk(c.merged, (work / "deploy_ed25519.pub").read_text(), frames_video)
        timed("boot", c.boot)
        inv = work / "fleet" / "devices.toml"
        dev = ArmDevice(c, arm64_root, inv, key, {})
        cli = Cli()
        dev.set_source(cli, "")  # idle until the prediction tests give it frames
        # a fresh device: enroll pins the host key, then finds no agent to initialise
        r = cli("devices", "enroll", dev.name, "--yes", *dev.args())
        assert r.code == 4 and "edgedeploy-agent not found on the device" in r.err, r.err
        r = timed("agent install", lambda: cli(*install_argv(dev), timeout=1200))
        assert r.code == 0, r.err
        dev.install = json.loads(r.out)
        c.exec(["rm", "/etc/sudoers.d/00-bootstrap"])  # from now on: only what the installer granted
        r = cli("devices", "enroll", dev.name, "--yes", *dev.args(), timeout=300)  # the installed agent answers
        assert r.code == 0, r.err
        yield dev
    finally:
        try:
            if request.session.testsfailed and c.leader:  # what the device looked like, for the failed test
                dumps = (["ls", "-la", ROOT, f"{ROOT}/run"], ["systemctl", "status", UNIT], ["journalctl", "-n", "60"])
                for argv in dumps:
                    p = c.exec(argv, check=False)
                    print(f"\n$ {' '.join(argv)}\n{p.stdout}{p.stderr}")
        finally:  # a failing dump must not leave the container running and its overlay mounted
            c.close()
        print(f"\narm64 container timings (s): root {arm64_root.timings}, boots {c.boots}, steps {TIMINGS}")


# --- the tests, in order ------------------------------------------------------------------------------


@in_container
def test_agent_install_sets_up_the_systemd_service_for_a_non_root_login(arm: ArmDevice) -> None:
    changed = arm.install["changed"]
    for step in ("create user", "install agent", "install sudoers rule", "install unit", "enable unit"):
        assert step in changed, changed
    assert arm.install["healthy"] and arm.install["facts"]["arch"] == "aarch64"
    host_key = (arm.prepared.root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[1]
    assert host_key in (arm.inventory.parent / "known_hosts").read_text()  # enroll pinned the device's own key
    c = arm.container
    assert c.exec(["systemctl", "is-enabled", UNIT]).stdout.strip() == "enabled"
    assert c.exec(["stat", "-c", "%a %U", "/etc/sudoers.d/edgedeploy"]).stdout.split() == ["440", "root"]
    assert "edgedeploy" in c.exec(["id", "-nG", LOGIN]).stdout.split()
    assert arm.ssh("sudo", "-n", "true").returncode != 0  # the bootstrap grant is gone
    py = arm.ssh(f"{VENV}/bin/python", "-c", "import sys, platform; print(sys.version_info[:2], platform.machine())")
    assert py.stdout.strip() == "(3, 9) aarch64", py
    glibc = arm.ssh("ldd", "--version").stdout.splitlines()[0]
    assert glibc.endswith(" 2.31"), glibc
    no_tvm = arm.ssh(f"{VENV}/bin/python", "-c", "import tvm")
    assert no_tvm.returncode != 0 and "No module named 'tvm'" in no_tvm.stderr, no_tvm


@in_container
def test_the_cuda_backend_loads_on_the_device_and_says_it_has_no_driver(arm: ArmDevice) -> None:
    """edgedeploy's CUDA backend, built here with aarch64-linux-gnu-g++ and uploaded by the install, loads in the
    emulated Xavier's Python 3.9 beside the aarch64 libtvm_runtime.so (glibc 2.31, Debian 11's libstdc++) and
    says in one line why it cannot run: this root has no NVIDIA driver."""
    assert "upload CUDA backend" in arm.install["changed"] and arm.install["cuda_backend"] == "built here"
    script = (
        "import ctypes, tvm_ffi\n"
        f"ctypes.CDLL('{ROOT}/lib/libtvm_runtime.so', ctypes.RTLD_GLOBAL)\n"
        f"ctypes.CDLL('{ROOT}/lib/libedgedeploy_cuda.so', ctypes.RTLD_GLOBAL)\n"
        "print(tvm_ffi.get_global_func('edgedeploy.cuda.backend_info')()['problem'])\n"
    )
    r = arm.ssh(f"{VENV}/bin/python", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("edgedeploy CUDA backend: no CUDA driver: libcuda.so.1 cannot be loaded"), r.stdout


def push(cli: Cli, arm: ArmDevice, bundle: Path, *extra: str) -> Any:
    return cli("push", arm.name, str(bundle), "--json", *extra, *arm.args(), timeout=900)


def reference_scores(bundle: Path, frames: list[np.ndarray], work: Path) -> list[np.ndarray]:
    """Every class's score from the x86 bundle on this machine, through the agent's own preprocessing and top_k."""
    m = extract_bundle(bundle, work)
    rt = load_runtime(work, m)
    everything = m.model_copy(update={"postprocess": m.postprocess.model_copy(update={"top_k": 10**6})})
    out = []
    for f in frames:
        scores = np.zeros(m.outputs[0].shape[-1])
        for index, _, score in top_k(rt.run([preprocess(f, m.preprocess, m.inputs[0])])[0], everything, []):
            scores[index] = score
        out.append(scores)
    return out


@in_container
@pytest.mark.parametrize("model", ["mnist", "mobilenet"])
def test_pushed_int8_bundles_predict_on_the_device_what_the_x86_bundle_predicts(
    arm: ArmDevice, cli: Cli, bundles: dict[str, Path], frames_video: Path, model: str, tmp_path: Path
) -> None:
    arm.set_source(cli, f"file:{FRAMES}")
    bundle = bundles[f"{model}-xavier-cpu"]
    r = timed(f"push {model}", lambda: push(cli, arm, bundle))
    assert r.code == 0, r.err
    pushed = json.loads(r.out)
    manifest = read_manifest(bundle)
    assert pushed["outcome"] == "committed" and pushed["release"] == manifest.release_name
    arm.releases[model] = manifest.release_name
    # the clip plays once: the agent serves every frame, then ends; systemd does not restart a clean exit
    wait_for("the clip to finish", lambda: arm.unit()["ActiveState"] == "inactive", timeout=300)
    assert arm.unit()["Result"] == "success"
    r = cli("status", arm.name, "--json", *arm.args(), timeout=300)
    assert r.code == 0, r.err
    reports = [x for x in json.loads(r.out)["new_reports"] if x["bundle_id"] == manifest.bundle_id]
    device = {p["frame"]: p["top"] for rep in reports for p in rep["predictions"]}
    frames = decoded(frames_video)
    assert sorted(device) == list(range(len(frames)))
    x86 = reference_scores(bundles[f"{model}-cpu-x86_64"], frames, tmp_path / "x86")
    for i, ref in enumerate(x86):
        # INT8 outputs are dequantized int8: classes tie, and the two machines may list tied classes in another
        # order. So: every class the device names has the x86 score, and the scores are the x86 top scores
        classes, scores = [t[0] for t in device[i]], [t[2] for t in device[i]]
        np.testing.assert_allclose(ref[classes], scores, atol=2e-6, err_msg=f"frame {i}")
        np.testing.assert_allclose(np.sort(ref)[::-1][: len(scores)], scores, atol=2e-6, err_msg=f"frame {i}")
    if model == "mnist":  # and they are right: the first frames are MNIST test digits 7 2 1 0 4 1
        assert [device[i][0][0] for i in range(DIGITS)] == [7, 2, 1, 0, 4, 1][:DIGITS]


@in_container
def test_a_bundle_failing_its_health_check_on_real_frames_rolls_back(
    arm: ArmDevice, cli: Cli, bundles: dict[str, Path], tmp_path: Path
) -> None:
    good = arm.releases["mobilenet"]
    bad = crashing_on_real_frames(bundles["mnist-xavier-cpu"], tmp_path / "crash.edb")
    r = timed("push failing bundle", lambda: push(cli, arm, bad))
    assert r.code == 4, (r.out, r.err)
    assert "failed its health check" in r.err and "rolled back" in r.err and good in r.err, r.err
    f = arm.facts(cli)
    assert f["current_release"] == good and f["healthy_release"] == good, f


@in_container
def test_systemd_sees_ready_and_watchdog_and_the_login_may_restart_the_unit(
    arm: ArmDevice, cli: Cli, bundles: dict[str, Path]
) -> None:
    arm.set_source(cli, "")  # no source: the agent idles, pinging the watchdog from its main loop
    r = timed("push --force (idle)", lambda: push(cli, arm, bundles["mobilenet-xavier-cpu"], "--force"))
    assert r.code == 0, r.err
    u = arm.unit()
    # Type=notify: active/running only after READY=1; STATUS= came from the agent (NotifyAccess=main)
    assert (u["ActiveState"], u["SubState"]) == ("active", "running") and u["StatusText"].startswith("serving"), u
    assert u["WatchdogUSec"] == "30s", u
    first = int(u["WatchdogTimestampMonotonic"])
    later = wait_for(
        "a WATCHDOG=1", lambda: int(arm.unit()["WatchdogTimestampMonotonic"]) > first and arm.unit(), timeout=60
    )
    assert later["MainPID"] == u["MainPID"]
    restart = timed("sudo restart", lambda: arm.ssh("sudo", "-n", "systemctl", "restart", UNIT))
    assert restart.returncode == 0, restart.stderr
    after = arm.unit()
    assert after["MainPID"] != u["MainPID"] and (after["ActiveState"], after["SubState"]) == ("active", "running")
    denied = arm.ssh("sudo", "-n", "systemctl", "restart", "ssh.service")
    assert denied.returncode != 0 and "password is required" in denied.stderr, denied


@in_container
def test_a_hung_agent_is_killed_by_the_watchdog_and_restarted(arm: ArmDevice) -> None:
    before = arm.unit()
    pid = before["MainPID"]
    arm.container.exec(["kill", "-STOP", pid])

    def restarted() -> dict[str, str] | None:
        u = arm.unit()
        running = u["MainPID"] not in ("0", pid) and (u["ActiveState"], u["SubState"]) == ("active", "running")
        return u if running else None

    after = timed("watchdog restart", lambda: wait_for("the watchdog restart", restarted, timeout=180))
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    journal = arm.container.exec(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"]).stdout
    assert "Watchdog timeout" in journal, journal[-2000:]


@in_container
def test_the_journal_has_the_agents_logs(arm: ArmDevice) -> None:
    journal = arm.container.exec(["journalctl", "-u", UNIT, "--no-pager", "-o", "cat"]).stdout
    assert arm.releases["mobilenet"] in journal, journal[-2000:]


@in_container
def test_a_restarted_container_comes_back_on_the_committed_release(arm: ArmDevice, cli: Cli) -> None:
    timed("reboot", lambda: (arm.container.poweroff(), arm.container.boot()))
    good = arm.releases["mobilenet"]
    f = wait_for("the agent after boot", lambda: (f := arm.facts(cli))["health_state"] == "ready" and f, timeout=300)
    assert f["current_release"] == good and f["healthy_release"] == good, f
    assert arm.unit()["ActiveState"] == "active"
    previous_boot = arm.container.exec(["journalctl", "-b", "-1", "-u", UNIT, "--no-pager", "-o", "cat"]).stdout
    assert "Watchdog timeout" in previous_boot  # the journal is persistent, as on JetPack


@in_container
def test_the_agent_runs_as_the_service_user_without_privileges_on_a_read_only_system(arm: ArmDevice) -> None:
    """What of the hardening is enforced here (the unit's seccomp filters are not: QEMU user mode keeps the
    emulated systemd from installing them; docs/agent-service.md)."""
    c, pid = arm.container, arm.unit()["MainPID"]
    assert c.exec(["ps", "-o", "user=", "-p", pid]).stdout.strip() == "edgedeploy"
    status = c.exec(["cat", f"/proc/{pid}/status"]).stdout
    assert re.search(r"^NoNewPrivs:\s+1$", status, re.M), status
    assert re.search(r"^CapEff:\s+0+$", status, re.M) and re.search(r"^CapBnd:\s+0+$", status, re.M), status
    mounts = {f[4]: f[5] for f in (ln.split() for ln in c.exec(["cat", f"/proc/{pid}/mountinfo"]).stdout.splitlines())}
    assert mounts["/"].startswith("ro") and mounts[ROOT].startswith("rw"), mounts  # ProtectSystem=strict
    assert c.exec(["stat", "-c", "%U %a", ROOT]).stdout.split() == ["edgedeploy", "2770"]


@in_container
@pytest.mark.parametrize(("cut_in", "version"), [("activating", "77"), ("health-check", "78")])
def test_a_push_cut_off_mid_activation_is_finished_by_the_device(
    arm: ArmDevice, cli: Cli, bundles: dict[str, Path], tmp_path: Path, cut_in: str, version: str
) -> None:
    """Issue 40 item 10 under systemd: the host and its deploy die while the device activates a new release, or
    checks it (an objective only the host wanted holds the check open); edgedeploy-agent-finish.timer starts the
    finisher, in a unit of its own, which checks the release on real frames by itself and commits it. No host
    contact after the cut."""
    c = arm.container
    arm.set_source(cli, looped(FRAMES))
    new = with_version(bundles["mnist-xavier-cpu"], tmp_path / "new.edb", version)
    release = read_manifest(new).release_name
    argv = [str(BIN / "edgedeploy"), "push", arm.name, str(new), "--json", "--min-inferences", "100000000",
            "--timeout", "900", *arm.args()]  # fmt: skip
    host = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_file = (
        c.merged / ROOT.lstrip("/") / "models" / "default" / "state.json"
    )  # the device's disk, read from here: no exec per poll

    def state() -> dict[str, Any]:
        try:
            return dict(json.loads(state_file.read_text()))
        except (OSError, ValueError):
            return {"pending": None}

    try:
        timed(f"push to {cut_in}", lambda: wait_for(
            f"the push to reach {cut_in}", lambda: (state().get("pending") or {}).get("state") == cut_in, 600,
            every=0.01,
        ))  # fmt: skip
        host.send_signal(signal.SIGSTOP)  # frozen first: it must not see its deploy die and recover over SSH
        c.exec(["pkill", "-KILL", "-f", f"{ROOT} --json deploy"], check=False)  # the deploy, with its session
    finally:
        host.kill()
        host.wait()
    assert (state()["pending"] or {}).get("state") == cut_in, state()["pending"]

    def settled() -> dict[str, Any] | None:
        s = state()
        return s if s.get("current") and s["pending"] is None else None

    done = timed(f"finished by the device ({cut_in})", lambda: wait_for("the device to finish", settled, 600, every=5))
    events = [h["event"] for h in done["history"]]
    assert done["current"] == release and events[-1] == "committed-after-interruption", (done["current"], events)
    # the finisher unit did it (its timer's idle runs answer `"finished": null`; this one says what it finished)
    finisher = c.exec(["journalctl", "-u", FINISH_UNIT, "--no-pager", "-o", "cat"]).stdout
    answers = [json.loads(ln) for ln in finisher.splitlines() if ln.startswith("{")]
    assert any((a.get("finished") or {}).get("release") == release for a in answers), finisher[-2000:]
    wait_for("the new release serving", lambda: arm.unit()["ActiveState"] == "active", 300)
    f = arm.facts(cli)
    assert f["current_release"] == release and f["healthy_release"] == release, f


# --- model slots: a second model in its own instance of the template unit ------------------------------


@contextmanager
def bootstrap_grant(arm: ArmDevice) -> Iterator[None]:
    """The technician's sudo grant, given back for an `agent install`, then taken away again."""
    grant = arm.container.merged / "etc/sudoers.d/00-bootstrap"
    grant.write_text(f"{LOGIN} ALL=(ALL) NOPASSWD: ALL\n")
    grant.chmod(0o440)
    try:
        yield
    finally:
        grant.unlink()


def install_argv(arm: ArmDevice, *extra: str) -> list[str]:
    return [
        "agent", "install", arm.name, "--python", "python3.9", "--venv", VENV,
        "--runtime-lib", str(arm.prepared.runtime_lib), *extra, "--json", *arm.args(),
    ]  # fmt: skip


@in_container
def test_a_second_model_is_served_by_its_own_instance_of_the_template_unit(
    arm: ArmDevice, cli: Cli, bundles: dict[str, Path]
) -> None:
    """Issue 36's model slots under a real systemd: the inventory names a second model, `agent install` again
    instantiates the shipped templates for it, and `push --model cam2` starts edgedeploy-agent@cam2.service
    (Type=notify, the service user, `--model cam2`) while the default model's agent serves on; the login may
    restart the slot's unit (the installer's sudoers rule names it) and `status` shows both models."""
    c = arm.container
    with open(arm.inventory, "a", encoding="utf-8") as f:
        f.write(f"\n[devices.{arm.name}.models.cam2]\n")  # no source: the second agent idles
    with bootstrap_grant(arm):
        r = timed("agent install (model cam2)", lambda: cli(*install_argv(arm), timeout=1200))
    assert r.code == 0, r.err
    changed = json.loads(r.out)["changed"]
    assert "enable model cam2" in changed, changed
    slot_unit = "edgedeploy-agent@cam2.service"
    default = arm.unit()
    bundle = bundles["mnist-xavier-cpu"]
    try:
        r = timed("push --model cam2", lambda: push(cli, arm, bundle, "--model", "cam2"))
        assert r.code == 0 and json.loads(r.out)["model"] == "cam2", r.out + r.err
        u = arm.unit(slot_unit)
        assert (u["ActiveState"], u["SubState"]) == ("active", "running") and u["StatusText"].startswith("serving"), u
        assert c.exec(["ps", "-o", "user=", "-p", u["MainPID"]]).stdout.strip() == "edgedeploy"
        argv = c.exec(["cat", f"/proc/{u['MainPID']}/cmdline"]).stdout.split("\0")
        assert argv[argv.index("--model") + 1] == "cam2", argv
        assert arm.unit()["MainPID"] == default["MainPID"]  # the default model's agent was not touched
        restart = arm.ssh("sudo", "-n", "systemctl", "restart", slot_unit)
        assert restart.returncode == 0, restart.stderr
        assert wait_for("cam2 restarted", lambda: arm.unit(slot_unit)["MainPID"] not in ("0", u["MainPID"]), 120)
        r = cli("status", arm.name, *arm.args(), timeout=300)
        release = read_manifest(bundle).release_name
        assert r.code == 0 and f"model cam2: {release}, agent ready" in r.out, r.out + r.err
    finally:
        c.exec(["systemctl", "stop", slot_unit], check=False)


# --- pull rollouts: the watch service deploys, the restart path unit restarts the inference unit --------


def install_for_pull(cli: Cli, arm: ArmDevice, fleet: PullFleet) -> dict[str, Any]:
    """`agent install --mqtt` by a technician with the bootstrap grant (given back for it, then taken away)."""
    install = install_argv(
        arm, "--mqtt", fleet.broker.address, "--registry", fleet.cache.url, "--broker-passwd",
        str(fleet.broker.base / "passwd"),
    )  # fmt: skip
    with bootstrap_grant(arm):
        r = timed("agent install --mqtt", lambda: cli(*install, timeout=1200))
        assert r.code == 0, r.err
        again = timed("agent install --mqtt again", lambda: cli(*install, timeout=1200))
        assert again.code == 0 and json.loads(again.out)["changed"] == [], again.out + again.err
    assert fleet.broker.proc is not None
    fleet.broker.proc.send_signal(signal.SIGHUP)  # mosquitto reads its password file again
    return dict(json.loads(r.out))


@in_container
def test_a_pull_rollout_over_mqtt_restarts_the_inference_unit_without_sudo(
    arm: ArmDevice, cli: Cli, bundles: dict[str, Path], tmp_path: Path, hermetic: Path
) -> None:
    """Desired state from a real mosquitto here, the bundle from a real registry here; in the container the
    watch service (NoNewPrivileges=yes, no sudo possible) downloads and activates it, and asks the restart
    path unit to restart edgedeploy-agent.service onto the new release."""
    require("FLEET_SERVERS", servers_available())
    c = arm.container
    fleet = start_pull_fleet(tmp_path / "pull", cli, [arm.name])
    try:
        fleet.setup_host(hermetic)
        for port in (fleet.broker.port, fleet.cache.port):
            c.forward_in(port)
        assert cli("keys", "install", arm.name, *arm.args()).code == 0  # the bundle key, pinned as at enrolment
        installed = install_for_pull(cli, arm, fleet)
        for step in ("install broker password", "configure watch", f"install {WATCH_UNIT}", "start pull units"):
            assert step in installed["changed"], installed["changed"]
        assert installed["broker_user"]["added_to"] == str(fleet.broker.base / "passwd")
        mode = c.exec(["stat", "-c", "%a %U", f"{ROOT}/mqtt-password"]).stdout.split()
        assert mode == ["600", "edgedeploy"], mode
        bundle = tmp_path / "signed.edb"
        assert cli("sign", str(bundles["mnist-xavier-cpu"]), "--key", "fleet-1", "-o", str(bundle)).code == 0
        release = read_manifest(bundle).release_name
        env = {"EDGEDEPLOY_REGISTRY_PASSWORD": PUBLISHER[1]}
        registry = f"{fleet.origin.address}/models/mnist"
        r = cli("publish", str(bundle), "--registry", registry, "--user", PUBLISHER[0], env=env)
        assert r.code == 0, r.err
        before = arm.unit()
        watch = ["systemctl", "show", "-p", "MainPID", "--value", WATCH_UNIT]
        watch_pid = wait_for("the watch service", lambda: (pid := c.exec(watch).stdout.strip()) != "0" and pid, 60)
        status = c.exec(["cat", f"/proc/{watch_pid}/status"]).stdout
        assert re.search(r"^NoNewPrivs:\s+1$", status, re.M) and re.search(r"^CapEff:\s+0+$", status, re.M), status
        assert c.exec(["ps", "-o", "user=", "-p", watch_pid]).stdout.strip() == "edgedeploy"

        r = timed("pull rollout", lambda: cli(
            "rollout", str(bundle), "--devices", arm.name, "--via", "mqtt", "--canary", "0", "--timeout", "300",
            "--pull-timeout", "300", "--json", *arm.args(), timeout=900,
        ))  # fmt: skip
        journal = c.exec(["journalctl", "-u", WATCH_UNIT, "--no-pager", "-o", "cat"]).stdout
        assert r.code == 0, r.out + r.err + journal[-3000:]
        assert json.loads(r.out)["devices"][arm.name]["status"] == "committed"
        after = arm.unit()
        assert after["MainPID"] != before["MainPID"] and (after["ActiveState"], after["SubState"]) == (
            "active",
            "running",
        )
        f = arm.facts(cli)
        assert f["current_release"] == release and f["healthy_release"] == release, f
        restarts = c.exec(["journalctl", "-u", RESTART_UNIT, "--no-pager", "-o", "cat"]).stdout
        assert "Finished" in restarts or "Succeeded" in restarts or "Deactivated successfully" in restarts, restarts
        assert "sudo" not in journal, journal[-3000:]
        r = cli("status", arm.name, "--via", "mqtt", "--json", *arm.args())
        assert r.code == 0 and json.loads(r.out)["devices"][arm.name]["state"] == "committed", r.out + r.err

        # the deploying login's pushes restart through the same path unit now (the request file is the group's)
        pushed = tmp_path / "signed-mobilenet.edb"
        assert cli("sign", str(bundles["mobilenet-xavier-cpu"]), "--key", "fleet-1", "-o", str(pushed)).code == 0
        starts = restarts.count("Starting edgedeploy: restart the inference agent (requested")
        pid = arm.unit()["MainPID"]
        r = timed("push through the path unit", lambda: push(cli, arm, pushed))
        assert r.code == 0 and json.loads(r.out)["release"] == read_manifest(pushed).release_name, r.err
        assert arm.unit()["MainPID"] != pid
        restarts = c.exec(["journalctl", "-u", RESTART_UNIT, "--no-pager", "-o", "cat"]).stdout
        assert restarts.count("Starting edgedeploy: restart the inference agent (requested") == starts + 1, restarts
        # whoever wrote it last (the login's push, the watch, the finisher), the other may rewrite it: group, 660
        owner = c.exec(["stat", "-c", "%U %G %a", f"{ROOT}/run/restart-request"]).stdout.split()
        assert owner[0] in ("edgedeploy", LOGIN) and owner[1:] == ["edgedeploy", "660"], owner
    finally:
        c.exec(["systemctl", "stop", WATCH_UNIT], check=False)
        fleet.close()
