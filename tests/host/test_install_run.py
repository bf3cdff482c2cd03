"""`agent install` probes a device once: the plan is built from that one probe and the executor runs it.
The device is this machine (the local transport, the real agent); a spy over the transport counts."""

from __future__ import annotations

import getpass
import shutil
import sys
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from edgedeploy.inventory import Device, Inventory
from edgedeploy.remote import install_run
from edgedeploy.remote.install import PROBE, STAMP, InstallOptions
from edgedeploy.remote.transport import CommandResult, LocalTransport, Progress


class Spy(LocalTransport):
    """The local transport, recording what it was asked to run and upload."""

    def __init__(self) -> None:
        self.runs: list[list[str]] = []
        self.puts: list[str] = []

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        self.runs.append(list(argv))
        return super().run(argv, timeout)

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        self.puts.append(remote)
        super().put(local, remote, progress)

    def probes(self) -> int:
        """How often the install probe ran (with or without more lines of the same script after it)."""
        return sum(argv[:2] == ["sh", "-c"] and argv[2].startswith(PROBE) for argv in self.runs)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    t = Spy()

    @contextmanager
    def connected(*args: Any) -> Iterator[Spy]:
        yield t

    monkeypatch.setattr(install_run, "connected", connected)
    return t


def _wheelhouse(folder: Path) -> Path:
    folder.mkdir()
    with zipfile.ZipFile(folder / "edgedeploy-0.1.0-py3-none-any.whl", "w") as z:
        z.writestr("edgedeploy_agent/__init__.py", "__version__ = '0.1.0'\n")
    return folder


def _wrapper(path: Path, target: Path) -> None:
    """A venv's bin/ entry that runs the test environment's (this venv already has the agent and OpenCV)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec "{target}" "$@"\n')
    path.chmod(0o755)


def test_an_install_probes_the_device_once(spy: Spy, tmp_path: Path) -> None:
    root, venv = tmp_path / "root", tmp_path / "venv"
    runtime = tmp_path / "libtvm_runtime.so"
    runtime.write_bytes(b"a runtime library")
    inv = Inventory(tmp_path / "devices.toml", {})
    dev = Device(
        name="here", host="localhost", profile="cpu-x86_64", user=getpass.getuser(), root=str(root),
        service="process", transport="local",
    )  # fmt: skip
    inv.add(dev)
    options = InstallOptions(
        python=sys.executable, venv=str(venv), wheelhouse=_wheelhouse(tmp_path / "house"), runtime_lib=runtime
    )

    plan = install_run.install_agent(inv, "here", options, dry_run=True)
    assert {"create venv", "install agent", "upload TVM runtime", "initialise agent root"} <= set(plan["steps"])
    # this machine has no NVIDIA driver: the CUDA backend is neither built nor uploaded (test_install_plan)
    assert "upload CUDA backend" not in plan["steps"] and plan["cuda_backend"].startswith("not needed")
    assert spy.probes() == 1 and len(spy.runs) == 1 and not spy.puts and not venv.exists()

    # a device that already has all of it: the plan is empty, and the one probe is all it asked
    agent = Path(sys.executable).with_name("edgedeploy-agent")
    _wrapper(venv / "bin" / "python", Path(sys.executable))
    _wrapper(venv / "bin" / "edgedeploy-agent", agent)
    wheels = sorted((tmp_path / "house").glob("*.whl"))
    (venv / STAMP).write_text(install_run.install_spec(dev, options, wheels).stamp)
    (root / "lib").mkdir(parents=True)
    shutil.copy(runtime, root / "lib" / "libtvm_runtime.so")
    lib = str(root / "lib" / "libtvm_runtime.so")
    assert LocalTransport().run([str(agent), "--root", str(root), "init", "--tvm-runtime-lib", lib]).exit_code == 0
    spy.runs.clear()

    res = install_run.install_agent(inv, "here", options)
    assert res["changed"] == [] and res["healthy"], res
    assert spy.probes() == 1 and not spy.puts
    assert [argv[-1] for argv in spy.runs[1:]] == ["facts", install_run.OPENCV_PROBE]  # health check, OpenCV
    assert Inventory.load(inv.path).get("here").agent_command == f"{venv}/bin/edgedeploy-agent"
