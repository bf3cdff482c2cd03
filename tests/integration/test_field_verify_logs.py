"""`edgedeploy verify` and `edgedeploy logs` against real devices: a real sshd, a real agent serving a video.

A broken camera (the source pointed at a missing file) fails the checklist with the fix; the running agent
is never stopped by a verify; `logs --follow` ends on Ctrl-C with its device side, and on a dropped link
(a network-namespace device whose veth goes down) with one line and exit 3.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from edgedeploy.localdevice import LoopbackSshd, free_port
from tests.helpers import BIN, Cli, agent, assert_one_line_error, looped
from tests.integration.conftest import Enrolled, LabeledVideo, add_device
from tests.integration.netfleet import net_fleet

pytestmark = [pytest.mark.integration, pytest.mark.sshd]


def _serving(cli: Cli, sshd: LoopbackSshd, tmp_path: Path, video: Path, bundle: Path, name: str) -> Enrolled:
    """A device serving `bundle` on a looping video, so its agent keeps running."""
    dev = add_device(cli, sshd, tmp_path / "fleet" / "devices.toml", tmp_path / f"{name}-root", name, looped(video))
    assert cli("devices", "enroll", name, "--yes", *dev.args()).code == 0
    r = cli("push", name, str(bundle), "--json", *dev.args())
    assert r.code == 0 and json.loads(r.out)["outcome"] == "committed", r.err
    return dev


def _pid(dev: Enrolled) -> int:
    return int((dev.root / "models" / "default" / "run" / "agent.pid").read_text())


@pytest.fixture
def serving(cli: Cli, sshd: LoopbackSshd, tmp_path: Path, mnist_video: LabeledVideo, mnist_bundle: Path):
    dev = _serving(cli, sshd, tmp_path, mnist_video.path, mnist_bundle, "lab-01")
    yield dev
    agent("--root", str(dev.root), "--json", "stop")


def test_verify_a_serving_device_then_break_its_camera(cli: Cli, serving: Enrolled) -> None:
    pid = _pid(serving)
    r = cli("verify", serving.name, "--json", *serving.args())
    assert r.code == 0, r.out + r.err
    res = json.loads(r.out)
    checks = {c["name"]: c for c in res["checks"]}
    assert list(checks) == [
        "agent", "tvm runtime", "bundle vs hardware", "tensorrt", "pythons", "camera", "power", "thermal", "disk",
        "clock", "signing keys", "service", "release files", "health",
    ]  # fmt: skip
    assert res["overall"] in ("ok", "warning") and all(c["status"] != "failed" for c in checks.values())
    assert checks["camera"]["status"] == "ok" and checks["camera"]["data"]["width"] == 112, checks["camera"]
    assert checks["health"]["status"] == "ok" and "ready" in checks["health"]["detail"]
    assert checks["service"]["status"] == "ok" and "running" in checks["service"]["detail"]
    assert abs(checks["clock"]["data"]["skew_s"]) < 5 and checks["clock"]["status"] == "ok"
    assert checks["signing keys"]["status"] == "warning" and "keys install" in checks["signing keys"]["fix"]
    facts = json.loads(agent("--root", str(serving.root), "--json", "facts").out)
    assert _pid(serving) == pid and facts["running"] is True

    text = cli("verify", serving.name, *serving.args())
    print(text.out)  # shown with -s: the checklist docs/field.md quotes
    assert text.code == 0 and "ok       camera" in text.out and "fix: edgedeploy keys install" in text.out, text.out

    # break the camera: the device's source now names a file that is not there
    missing = serving.root.parent / "unplugged.avi"
    assert agent("--root", str(serving.root), "init", "--source", f"file:{missing}").code == 0
    broken = cli("verify", serving.name, *serving.args())
    assert broken.code == 1, broken.out + broken.err
    camera = [ln for ln in broken.out.splitlines() if " camera " in ln]
    assert camera and camera[0].lstrip().startswith("FAILED") and f"video file {missing} does not exist" in camera[0]
    line = broken.out.splitlines().index(camera[0])
    assert "fix: fix the source on the device" in broken.out.splitlines()[line + 1]
    assert "Traceback" not in broken.out + broken.err and _pid(serving) == pid


def test_verify_a_group_exit_codes(cli: Cli, sshd: LoopbackSshd, tmp_path: Path, mnist_video: LabeledVideo) -> None:
    inv = tmp_path / "fleet" / "devices.toml"
    for name in ("cam-a", "cam-b"):
        r = cli("devices", "add", name, "--host", sshd.host, "--port", str(sshd.port), "--user", sshd.user,
                "--key-file", str(sshd.client_key), "--profile", "cpu-x86_64", "--root", str(tmp_path / f"{name}-root"),
                "--service", "process", "--agent-command", str(BIN / "edgedeploy-agent"), "--source",
                f"file:{mnist_video.path}", "--tags", "lab", "--inventory", str(inv))  # fmt: skip
        assert r.code == 0, r.err
        assert cli("devices", "enroll", name, "--yes", "--inventory", str(inv)).code == 0
    r = cli("verify", "--group", "lab", "--json", "--inventory", str(inv))
    assert r.code == 0, r.out + r.err  # no bundle yet: warnings, nothing failed
    assert sorted(json.loads(r.out)["devices"]) == ["cam-a", "cam-b"]
    r = cli("devices", "add", "cam-c", "--host", "127.0.0.1", "--port", str(free_port()), "--profile", "cpu-x86_64",
            "--tags", "lab", "--inventory", str(inv))  # fmt: skip
    assert r.code == 0, r.err
    r = cli("verify", "--group", "lab", "--json", "--inventory", str(inv))
    assert r.code == 5, r.out + r.err  # one device unreachable: a partial failure, the others still checked
    res = json.loads(r.out)
    assert sorted(res["devices"]) == ["cam-a", "cam-b"] and list(res["unreachable"]) == ["cam-c"]
    assert cli("devices", "remove", "cam-c", "--inventory", str(inv)).code == 0

    assert agent("--root", str(tmp_path / "cam-b-root"), "init", "--source", "file:/nonexistent.avi").code == 0
    r = cli("verify", "--group", "lab", "--inventory", str(inv))
    assert r.code == 5, r.out + r.err
    assert "cam-a: warning" in r.out and "cam-b: failed" in r.out
    assert agent("--root", str(tmp_path / "cam-a-root"), "init", "--source", "v4l2:/dev/nonexistent").code == 0
    assert cli("verify", "--group", "lab", "--inventory", str(inv), "--camera-seconds", "1").code == 1
    assert_one_line_error(cli("verify", "--inventory", str(inv)), 2, "say which device")
    assert_one_line_error(cli("verify", "--group", "nope", "--inventory", str(inv)), 2, "has tag 'nope'")


def test_logs_lines_since_and_bad_input(cli: Cli, serving: Enrolled) -> None:
    log = serving.root / "logs" / "agent.log"
    r = cli("logs", serving.name, "--lines", "50", *serving.args())
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert any("edgedeploy-agent: starting mnist" in ln for ln in lines), r.out
    assert lines == log.read_text().splitlines()[-50:]
    one = cli("logs", serving.name, "-n", "1", *serving.args())
    assert one.code == 0 and one.out.splitlines() == log.read_text().splitlines()[-1:]
    with log.open("a") as f:  # an old line: outside --since 1h, inside 2d
        f.write("2020-01-01T00:00:00.000+00:00 edgedeploy-agent: long ago\n")
    recent = cli("logs", serving.name, "--since", "1h", *serving.args())
    assert recent.code == 0 and "long ago" not in recent.out and "starting" in recent.out, recent.out
    assert "long ago" in cli("logs", serving.name, *serving.args()).out

    assert_one_line_error(cli("logs", serving.name, "--lines", "0", *serving.args()), 2, "--lines must be between")
    assert_one_line_error(cli("logs", serving.name, "--lines", "10001", *serving.args()), 2, "--lines")
    assert_one_line_error(cli("logs", serving.name, "--since", "yesterday", *serving.args()), 2, "time span")
    log.unlink()
    assert_one_line_error(cli("logs", serving.name, *serving.args()), 4, "no agent log")


def _followers(root: Path) -> list[int]:
    """Agent `logs --follow` processes for this root (read from /proc, never signalled)."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                argv = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(root).encode() in argv and b"logs" in argv and b"--follow" in argv:
                found.append(int(p.name))
    return found


def _follow(dev_args: list[str], name: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "edgedeploy"), "logs", name, "--follow", *extra, *dev_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 60) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"logs ended (exit {proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError(f"no line with {text!r} within {timeout} s")


def test_logs_follow_ends_cleanly_on_ctrl_c(serving: Enrolled) -> None:
    with _follow(serving.args(), serving.name) as proc:
        _wait_for_line(proc, "starting")
        with (serving.root / "logs" / "agent.log").open("a") as f:
            f.write("2026-12-01T00:00:00.000+00:00 edgedeploy-agent: a new line\n")
        _wait_for_line(proc, "a new line", 30)
        assert _followers(serving.root)  # the device side is following
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
        assert proc.stderr is not None and "Traceback" not in proc.stderr.read()
    deadline = time.monotonic() + 15
    while _followers(serving.root) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _followers(serving.root), "the device's `logs --follow` outlived the host's Ctrl-C"


def test_logs_follow_on_a_dropped_link_is_one_line_exit_3(cli: Cli, tmp_path: Path, netns: None) -> None:
    with net_fleet(cli, tmp_path, ["cam-x"], first_index=41) as fleet:
        dev = fleet.devices["cam-x"]
        (dev.root / "logs" / "agent.log").write_text("2026-12-01T00:00:00.000+00:00 edgedeploy-agent: hello\n")
        with _follow(fleet.args(), "cam-x", "--io-timeout", "2") as proc:
            _wait_for_line(proc, "hello")
            dev.link.set_link(False)
            code = proc.wait(60)
            assert proc.stderr is not None
            err = proc.stderr.read()
        assert code == 3, err
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "connection lost" in errors[0] and "Traceback" not in err, err
