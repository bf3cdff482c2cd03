"""Real services for end-to-end tests: an OpenSSH server on loopback, real bundles, a real video."""

from __future__ import annotations

import gzip
import hashlib
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgedeploy.api import build
from edgedeploy.compile.cards import ModelCard
from edgedeploy.fleet_servers import servers_available
from edgedeploy.localdevice import LoopbackSshd
from edgedeploy_agent.bundle import Postprocess, Preprocess
from tests.helpers import Cli, agent, looped, require, require_sshd
from tests.integration.arm64root import PreparedRoot, prepare_root
from tests.integration.pullfleet import PullFleet, start_pull_fleet


def _agent_command(venv_agent: Path, pythonpath: str | None) -> str:
    """The agent the devices run over SSH. An SSH session starts with a clean environment, so with PYTHONPATH set
    (a worktree run: `PYTHONPATH=$PWD/host:$PWD/agent`) the venv's console script would import the code of the
    venv's editable install, not this tree's: a wrapper passes this run's PYTHONPATH on."""
    if not pythonpath:
        return str(venv_agent)
    folder = (
        Path(tempfile.gettempdir()) / "edgedeploy-test-agents" / hashlib.sha256(pythonpath.encode()).hexdigest()[:16]
    )
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "edgedeploy-agent"
    text = f'#!/bin/sh\nPYTHONPATH={shlex.quote(pythonpath)} exec {shlex.quote(str(venv_agent))} "$@"\n'
    if not wrapper.is_file() or wrapper.read_text() != text:
        tmp = folder / f".edgedeploy-agent.{os.getpid()}"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    return str(wrapper)


AGENT = _agent_command(Path(sys.executable).parent / "edgedeploy-agent", os.environ.get("PYTHONPATH"))


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[LoopbackSshd]:
    require_sshd()
    with LoopbackSshd(tmp_path / "sshd") as server:
        yield server


@dataclass
class LabeledVideo:
    path: Path
    labels: np.ndarray


def read_mnist(data_dir: Path, n: int) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(data_dir / "mnist" / "t10k-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)[:n]
    with gzip.open(data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)[:n]
    return images, labels


def write_digits_video(path: Path, images: np.ndarray, labels: np.ndarray) -> LabeledVideo:
    """MNIST digits, one per frame, 28x28 -> 112x112, MJPG at top quality."""
    w = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25.0, (112, 112))
    w.set(cv2.VIDEOWRITER_PROP_QUALITY, 100)
    for img in images:
        w.write(cv2.cvtColor(cv2.resize(img, (112, 112), interpolation=cv2.INTER_NEAREST), cv2.COLOR_GRAY2BGR))
    w.release()
    return LabeledVideo(path, labels)


@pytest.fixture(scope="session")
def mnist_video(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LabeledVideo:
    """The first 300 MNIST test digits."""
    images, labels = read_mnist(data_dir, 300)
    return write_digits_video(tmp_path_factory.mktemp("video") / "mnist-test.avi", images, labels)


MNIST_CARD = ModelCard(
    name="mnist",
    version="8",
    description="ONNX model zoo mnist-8",
    labels=[str(i) for i in range(10)],
    preprocess=Preprocess(color="gray", interpolation="area"),  # raw pixels 0..255
    postprocess=Postprocess(top_k=3, softmax=True),
)


@pytest.fixture(scope="session")
def agent39(python39: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`edgedeploy-agent` in a Python 3.9 venv, from `edgedeploy agent wheelhouse` (pip --no-index)."""
    work = tmp_path_factory.mktemp("py39")
    house = work / "wheelhouse"
    r = Cli()("agent", "wheelhouse", str(house), "--python", "3.9",
              "--platform", f"manylinux_2_28_{platform.machine()}", "--json", timeout=900)  # fmt: skip
    assert r.code == 0, r.err
    venv = work / "venv"
    subprocess.run([str(python39), "-m", "venv", str(venv)], check=True)
    wheel = next(house.glob("edgedeploy-*.whl"))
    pip = [str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(house)]
    subprocess.run([*pip, f"{wheel}[agent]"], check=True, timeout=900)
    return venv / "bin" / "edgedeploy-agent"


@pytest.fixture(scope="session")
def mnist_bundle(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "mnist.cpu-x86_64.edb"
    # (the session's cache: tests/conftest.py's hermetic_session)
    build(data_dir / "models" / "mnist-8_opset13.onnx", "cpu-x86_64", out, MNIST_CARD, use_cache=False)
    return out


@dataclass
class Enrolled:
    name: str
    inventory: Path
    root: Path
    sshd: LoopbackSshd

    def args(self) -> list[str]:
        return ["--inventory", str(self.inventory)]


def add_device(
    cli: Cli,
    sshd: LoopbackSshd,
    inventory: Path,
    root: Path,
    name: str = "dev1",
    source: str | None = None,
    profile: str = "cpu-x86_64",
) -> Enrolled:
    args = [
        "devices",
        "add",
        name,
        "--host",
        sshd.host,
        "--port",
        str(sshd.port),
        "--user",
        sshd.user,
        "--key-file",
        str(sshd.client_key),
        "--profile",
        profile,
        "--root",
        str(root),
        "--service",
        "process",
        "--agent-command",
        AGENT,
        "--inventory",
        str(inventory),
    ]
    if source:
        args += ["--source", source]
    r = cli(*args)
    assert r.code == 0, r.err
    return Enrolled(name, inventory, root, sshd)


@pytest.fixture
def device(cli: Cli, sshd: LoopbackSshd, tmp_path: Path, mnist_video: LabeledVideo) -> Iterator[Enrolled]:
    dev = add_device(
        cli, sshd, tmp_path / "fleet" / "devices.toml", tmp_path / "device-root", source=f"file:{mnist_video.path}"
    )
    r = cli("devices", "enroll", dev.name, "--yes", *dev.args())
    assert r.code == 0, r.err
    yield dev
    agent("--root", str(dev.root), "--json", "stop")  # leave no agent process behind


@pytest.fixture
def pull_fleet(  # a pull fleet: registry, cache, broker, two watch devices (tests/integration/pullfleet.py)
    cli: Cli, tmp_path: Path, hermetic: Path, mnist_video: LabeledVideo
) -> Iterator[PullFleet]:
    require("FLEET_SERVERS", servers_available())
    fleet = start_pull_fleet(tmp_path / "pull", cli, ["dev1", "dev2"])
    try:
        fleet.setup_host(hermetic)
        for name in ("dev1", "dev2"):
            fleet.add(name, f"file:{mnist_video.path}")
        yield fleet
    finally:
        fleet.close()


@pytest.fixture(scope="session")
def arm64_root(tmp_path_factory: pytest.TempPathFactory) -> PreparedRoot:
    """The arm64 root (tests/integration/arm64root.py), built once per recipe and cached on disk (~10 min)."""
    return prepare_root(tmp_path_factory.mktemp("arm64-root") / "build.log")


@pytest.fixture
def looping(cli: Cli, sshd, tmp_path: Path, mnist_video: LabeledVideo) -> Iterator[Enrolled]:
    """A device whose source plays the clip in a loop: its agent serves until it is stopped or killed."""
    dev = add_device(cli, sshd, tmp_path / "f" / "devices.toml", tmp_path / "root", source=looped(mnist_video.path))
    assert cli("devices", "enroll", dev.name, "--yes", *dev.args()).code == 0
    yield dev
    agent("--root", str(dev.root), "--json", "stop")
