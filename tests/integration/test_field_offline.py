"""No network on site: `edgedeploy-agent install-bundle FILE` from local media runs the push's path and leaves
its records; `edgedeploy agent install --offline WHEELHOUSE` sets up a device in a network namespace with no
route out, from a wheelhouse `edgedeploy agent wheelhouse` prepared (the agent's real wheels, pip --no-index).
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from tests.helpers import Cli, agent, assert_one_line_error
from tests.integration.conftest import Enrolled
from tests.integration.netfleet import net_fleet

pytestmark = pytest.mark.integration


def _state(root: Path) -> dict:
    return json.loads((root / "models" / "default" / "state.json").read_text())


def test_install_bundle_from_usb_is_the_push_path(
    cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path
) -> None:
    assert cli("keys", "generate", "site-key").code == 0
    assert cli("keys", "install", device.name, *device.args()).code == 0
    usb = tmp_path / "media" / "usb"
    usb.mkdir(parents=True)
    unsigned = Path(shutil.copy2(mnist_bundle, usb / "model.edb"))
    signed = usb / "signed.edb"
    assert cli("sign", str(mnist_bundle), "--key", "site-key", "-o", str(signed)).code == 0
    usb.chmod(0o555)  # a read-only stick: nothing is written next to the bundle
    try:
        r = agent("--root", str(device.root), "install-bundle", str(unsigned))
        assert r.code == 10 and "is not signed" in r.err and "edgedeploy sign" in r.err, r.err
        assert "Traceback" not in r.err and unsigned.is_file() and _state(device.root)["current"] is None
        assert _state(device.root)["history"] == []  # refused before anything moved, as a push is

        r = agent("--root", str(device.root), "install-bundle", str(signed), timeout=300)
        release = read_manifest(signed).release_name
        assert r.code == 0 and r.out.strip() == f"committed: {release} (was no bundle)", r.out + r.err
        st = _state(device.root)
        assert st["current"] == release and st["serial"]["serial"] == read_manifest(signed).serial
        assert [h["event"] for h in st["history"]] == ["committed"] and signed.is_file()
        # the same stick again once the service stopped (its video is short: it may have ended by now, so the
        # test stops it rather than race it): the bundle is checked again and serves again
        agent("--root", str(device.root), "--json", "stop")
        again = agent("--root", str(device.root), "--json", "install-bundle", str(signed), timeout=300)
        assert again.code == 0 and json.loads(again.out)["outcome"] == "committed", again.out + again.err
        assert _state(device.root)["current"] == release
    finally:
        usb.chmod(0o755)
    facts = json.loads(cli("devices", "facts", device.name, "--json", *device.args()).out)
    assert facts["current_release"] == release, facts
    missing = agent("--root", str(device.root), "install-bundle", str(usb / "nope.edb"))
    assert missing.code == 9 and "does not exist" in missing.err and "USB stick" in missing.err


def _offline_install(cli: Cli, tmp_path: Path, python: str, version: str, bundle: Path, index: int) -> None:
    house = tmp_path / "wheelhouse"
    t = time.monotonic()
    r = cli("agent", "wheelhouse", str(house), "--python", version,
            "--platform", f"manylinux_2_28_{platform.machine()}", "--json", timeout=900)  # fmt: skip
    assert r.code == 0, r.err
    made = json.loads(r.out)
    assert made["python"] == version and any(w.startswith("edgedeploy-") for w in made["wheels"])
    assert {"numpy", "pydantic_core", "opencv_python_headless", "apache_tvm_ffi"} <= {
        w.split("-")[0] for w in made["wheels"]
    }
    print(f"wheelhouse for Python {version}: {len(made['wheels'])} wheels in {time.monotonic() - t:.1f} s")
    with net_fleet(cli, tmp_path, ["site-1"], first_index=index) as fleet:
        ns = fleet.devices["site-1"].link.ns
        route = subprocess.run(["ip", "-n", ns, "route", "get", "1.1.1.1"], capture_output=True, text=True)
        assert route.returncode != 0 and "unreachable" in route.stderr, route  # no route out of the device
        venv = tmp_path / "site-venv"
        install = ["agent", "install", "site-1", "--venv", str(venv), "--python", python, *fleet.args()]

        wrong = tmp_path / "wrong-house"
        shutil.copytree(house, wrong)
        (wrong / "wheelhouse.json").write_text(json.dumps({**made, "python": "3.6"}))
        assert_one_line_error(cli(*install, "--offline", str(wrong)), 2, f"is for Python 3.6 on {platform.machine()}")
        assert not venv.exists()  # refused before anything was uploaded

        t = time.monotonic()
        r = cli(*install, "--offline", str(house), "--json", timeout=900)
        assert r.code == 0, r.err
        res = json.loads(r.out)
        print(f"offline install (Python {version}) in {time.monotonic() - t:.1f} s")
        assert res["healthy"] and {"create venv", "install agent"} <= set(res["changed"]), res
        assert res["agent_command"] == f"{venv}/bin/edgedeploy-agent"
        pushed = cli("push", "site-1", str(bundle), "--json", *fleet.args())
        assert pushed.code == 0 and json.loads(pushed.out)["outcome"] == "committed", pushed.err
        checked = cli("verify", "site-1", "--json", *fleet.args())
        checks = {c["name"]: c for c in json.loads(checked.out)["checks"]}
        assert checks["agent"]["data"]["python"].startswith(version + "."), checks["agent"]
        assert checks["tvm runtime"]["status"] == "ok" and checks["health"]["status"] == "ok", checks
        agent("--root", str(fleet.devices["site-1"].root), "--json", "stop")


@pytest.mark.sshd
def test_offline_install_on_a_device_with_no_route_out(
    cli: Cli, tmp_path: Path, mnist_bundle: Path, netns: None
) -> None:
    base = getattr(sys, "_base_executable", sys.executable)  # a plain interpreter, like a device's
    _offline_install(cli, tmp_path, base, f"{sys.version_info.major}.{sys.version_info.minor}", mnist_bundle, 44)


@pytest.mark.sshd
def test_offline_install_runs_the_agent_on_python_3_9(
    cli: Cli, tmp_path: Path, mnist_bundle: Path, netns: None, python39: Path
) -> None:
    _offline_install(cli, tmp_path, str(python39), "3.9", mnist_bundle, 45)
