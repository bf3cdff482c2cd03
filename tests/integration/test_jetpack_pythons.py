"""JetPack 5's two Pythons end to end: the agent installed in a Python 3.9 venv (from its real wheels), TensorRT in
its sidecar worker under a real CPython 3.8 (the TensorRT double, tests/agent/trt_double.py), driven through the
agent's own CLI as the host drives it: deploy on real frames, reports, and rollback when the 3.8 side is killed.

This machine has no GPU: the 3.9 agent's driver probe (agent/edgedeploy_agent/gpu.py, ctypes on libcuda.so.1)
finds tests/fixtures/fake_libcuda.c, six driver calls answering one T4 on a CUDA 11.4 driver; the worker asks the
double. (tests/agent/test_sidecar.py runs the same with the agent in this venv, in `make test`.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.sidecar.worker import DOUBLE_ENV
from tests.agent.bundles import reference_runs, with_version
from tests.agent.doubles import fake_libcuda as build_fake_libcuda
from tests.agent.trt_double import OPTIONS_ENV
from tests.helpers import looped, wait_for

pytestmark = [pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a libcuda.so.1 that answers one T4 on a CUDA 11.4 driver."""
    return Path(build_fake_libcuda(tmp_path_factory.mktemp("libcuda"), 11040, 75, "Tesla T4")).parent


def _health(root: Path) -> dict[str, object]:
    try:
        return dict(json.loads((root / "models" / "default" / "run" / "health.json").read_text()))
    except (OSError, ValueError):
        return {}


def test_agent_on_python39_serves_tensorrt_from_python38_and_rolls_back_when_it_dies(
    agent39: Path,
    jetpack_python: Path,
    mnist_trt_bundle: Path,
    fake_libcuda: Path,
    data_dir: Path,
    tmp_path: Path,
) -> None:
    root, hang = tmp_path / "root", tmp_path / "hang-now"
    v2 = with_version(mnist_trt_bundle, tmp_path / "v2.edb", "2")
    v1_name, v2_name = read_manifest(mnist_trt_bundle).release_name, read_manifest(v2).release_name
    # v2's engine (and only while `hang` exists) hangs on its third camera frame
    options = {"gpu": "T4", "hang_after_runs": reference_runs(v2) + 2, "hang_file": str(hang)}
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
    r = agent("init", "--device-name", "xavier-01", "--source", looped(clip),
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
        agent_pid = int((root / "models" / "default" / "run" / "agent.pid").read_text())
        assert os.path.basename(os.readlink(f"/proc/{agent_pid}/exe")).startswith("python3.9")
        wait_for(
            "a report", lambda: any((root / "spool").glob("*.jsonl")), 60, every=0.1
        )  # every report_interval_s (10)
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

        wait_for("v2 checking frames", lambda: worker_of_v2() is not None, 120, every=0.1)
        os.kill(worker_of_v2(), signal.SIGKILL)  # type: ignore[arg-type]
        hang.unlink()  # v1, restarted by the rollback, serves
        out, err = deploying.communicate(timeout=300)
        assert deploying.returncode != 0, out
        answer = json.loads(out.strip().splitlines()[-1])
        assert answer["error"]["code"] == "health-check-failed", answer
        assert "killed by SIGKILL" in answer["error"]["message"], answer
        state = json.loads((root / "models" / "default" / "state.json").read_text())
        assert state["current"] == v1_name and state["history"][-1]["event"] == "rolled-back"
        wait_for("v1 ready again", lambda: _health(root).get("state") == "ready", 120, every=0.1)
        assert _health(root)["release"] == v1_name
    finally:
        pid_file = root / "models" / "default" / "run" / "agent.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except ProcessLookupError:
                pass
            wait_for("the agent to stop", lambda: not _agent_alive(pid_file), 30, every=0.1)


def _agent_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (ProcessLookupError, ValueError, FileNotFoundError):
        return False
    return Path(f"/proc/{int(pid_file.read_text())}/stat").read_text().split(") ", 1)[1][0] != "Z"
