"""JetPack 5's two Pythons end to end: the agent installed in a Python 3.9 venv (from its real wheels), TensorRT in
its sidecar worker under a real CPython 3.8 (the TensorRT double, tests/agent/trt_double.py), driven through the
agent's own CLI as the host drives it: deploy on real frames, reports, and rollback when the 3.8 side is killed.

This machine has no GPU: the 3.9 agent's driver probe (agent/edgedeploy_agent/gpu.py, ctypes on libcuda.so.1)
finds tests/fixtures/fake_libcuda.c, six driver calls answering one T4 on a CUDA 11.4 driver; the worker asks the
double. (tests/agent/test_sidecar.py runs the same with the agent in this venv, in `make test`.)
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.sidecar.worker import DOUBLE_ENV
from tests.agent.bundles import rewrite_bundle
from tests.agent.trt_double import OPTIONS_ENV
from tests.helpers import require

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("libcuda")
    r = subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(out / "libcuda.so.1"), str(REPO / "tests/fixtures/fake_libcuda.c")],
        capture_output=True,
        text=True,
    )
    require("GCC", None if r.returncode == 0 else f"gcc cannot build the libcuda stand-in: {r.stderr[-200:]}")
    return out


def _health(root: Path) -> dict[str, object]:
    try:
        return dict(json.loads((root / "run" / "health.json").read_text()))
    except (OSError, ValueError):
        return {}


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _reference_runs(bundle: Path) -> int:
    """The engine runs before the first camera frame: one per reference sample (batch 1), and the warm-up."""
    m = read_manifest(bundle)
    with tarfile.open(bundle, "r:gz") as tar:
        member = tar.extractfile(m.tensorrt.reference)  # type: ignore[union-attr]
        assert member is not None
        with np.load(io.BytesIO(member.read())) as z:
            return int(z[f"input:{m.inputs[0].name}"].shape[0]) + 1


def test_agent_on_python39_serves_tensorrt_from_python38_and_rolls_back_when_it_dies(
    agent39: Path,
    jetpack_python: Path,
    mnist_trt_bundle: Path,
    fake_libcuda: Path,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    root, hang = tmp_path / "root", tmp_path / "hang-now"
    v2 = rewrite_bundle(
        mnist_trt_bundle,
        tmp_path / "v2.edb",
        lambda n, d: (n, d.replace(b'"version":"1"', b'"version":"2"')) if n == "manifest.json" else (n, d),
    )
    v1_name, v2_name = read_manifest(mnist_trt_bundle).release_name, read_manifest(v2).release_name
    # v2's engine (and only while `hang` exists) hangs on its third camera frame
    options = {"gpu": "T4", "hang_after_runs": _reference_runs(v2) + 2, "hang_file": str(hang)}
    env = {
        **os.environ,
        DOUBLE_ENV: "tests.agent.trt_double:sidecar_double",
        OPTIONS_ENV: json.dumps(options),
        "PYTHONPATH": str(REPO),
        "LD_LIBRARY_PATH": str(fake_libcuda),
    }

    def agent(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [str(agent39), "--root", str(root), "--json", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)

    clip = data_dir / "video" / "bikes.mp4"
    r = agent("init", "--device-name", "xavier-01", "--source", f"file:{clip}?loop=1",
              "--system-python", str(jetpack_python), "--health-frames", "5")  # fmt: skip
    assert r.returncode == 0, r.stderr
    try:
        r = agent("deploy", str(mnist_trt_bundle), "--timeout", "120", "--build-timeout", "120")
        assert r.returncode == 0, r.stdout + r.stderr
        health = _health(root)
        runtime = health["runtime"]
        assert health["release"] == v1_name and health["state"] == "ready"
        assert isinstance(runtime, dict) and runtime["tensorrt"] == "8.5.2.2" and runtime["engine"] == "built"
        assert str(runtime["tensorrt_python"]).startswith("3.8.")
        agent_pid = int((root / "run" / "agent.pid").read_text())
        assert os.path.basename(os.readlink(f"/proc/{agent_pid}/exe")).startswith("python3.9")
        _wait_for(lambda: any((root / "spool").glob("*.jsonl")), 60, "a report")  # every report_interval_s (10)
        report = json.loads(sorted((root / "spool").glob("*.jsonl"))[0].read_text().splitlines()[0])
        assert report["runtime"] == "tensorrt" and report["frames"] > 0 and report["predictions"]

        hang.touch()
        deploying = subprocess.Popen(
            [
                str(agent39),
                "--root",
                str(root),
                "--json",
                "deploy",
                str(v2),
                "--timeout",
                "60",
                "--build-timeout",
                "120",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        def worker_of_v2() -> int | None:
            h = _health(root)
            if h.get("release") != v2_name or h.get("state") != "checking-frames":
                return None
            return int(str(h["runtime"]["tensorrt_python"]).rsplit("pid ", 1)[1].rstrip(")"))  # type: ignore[index]

        _wait_for(lambda: worker_of_v2() is not None, 120, "v2 checking frames")
        os.kill(worker_of_v2(), signal.SIGKILL)  # type: ignore[arg-type]
        hang.unlink()  # v1, restarted by the rollback, serves
        out, err = deploying.communicate(timeout=300)
        assert deploying.returncode != 0, out
        answer = json.loads(out.strip().splitlines()[-1])
        assert answer["error"]["code"] == "health-check-failed", answer
        assert "killed by SIGKILL" in answer["error"]["message"], answer
        state = json.loads((root / "state.json").read_text())
        assert state["current"] == v1_name and state["history"][-1]["event"] == "rolled-back"
        _wait_for(lambda: _health(root).get("state") == "ready", 120, "v1 ready again")
        assert _health(root)["release"] == v1_name
    finally:
        pid_file = root / "run" / "agent.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
            _wait_for(lambda: not _agent_alive(pid_file), 30, "the agent to stop")


def _agent_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (ProcessLookupError, ValueError, FileNotFoundError):
        return False
    return Path(f"/proc/{int(pid_file.read_text())}/stat").read_text().split(") ", 1)[1][0] != "Z"
