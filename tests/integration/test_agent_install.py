"""`edgedeploy agent install` over a real sshd, process mode: a fresh venv with the agent built from this
checkout and the TVM runtime, then a push that runs on it; a second install changes nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from edgedeploy.inventory import Inventory
from tests.helpers import Cli
from tests.integration.conftest import Enrolled

pytestmark = pytest.mark.integration


def test_install_then_push_then_idempotent(cli: Cli, device: Enrolled, mnist_bundle: Path, tmp_path: Path) -> None:
    venv = tmp_path / "device-venv"
    base_python = getattr(sys, "_base_executable", sys.executable)  # a plain interpreter, like a device's
    args = ["agent", "install", device.name, "--venv", str(venv), "--python", base_python, *device.args()]

    plan = cli(*args, "--dry-run", "--json")
    assert plan.code == 0, plan.err
    planned = json.loads(plan.out)["steps"]
    assert "create venv" in planned and "install agent" in planned and not venv.exists()

    r = cli(*args, "--json", timeout=900)
    assert r.code == 0, r.err
    res = json.loads(r.out)
    assert res["healthy"] and res["agent_command"] == f"{venv}/bin/edgedeploy-agent"
    assert {"create venv", "install agent", "upload TVM runtime", "initialise agent root"} <= set(res["changed"])
    assert res["opencv"].endswith("v4l2-only")  # the pip OpenCV wheel: said plainly, not discovered later
    assert Inventory.load(device.inventory).get(device.name).agent_command == res["agent_command"]

    pushed = cli("push", device.name, str(mnist_bundle), "--json", *device.args())
    assert pushed.code == 0, pushed.err
    assert json.loads(pushed.out)["outcome"] == "committed"
    config = json.loads((device.root / "agent.json").read_text())
    assert config["tvm_runtime_lib"] == f"{device.root}/lib/libtvm_runtime.so"

    again = cli(*args, "--json", timeout=900)
    assert again.code == 0, again.err
    assert json.loads(again.out)["changed"] == []  # nothing to do the second time
