"""Activation of a TensorRT bundle: engine built and accepted before `ready`, and the health wait for it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from edgedeploy_agent.cli import _parser
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.loop import run_agent
from edgedeploy_agent.service import read_health, wait_healthy, write_health
from edgedeploy_agent.spool import pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.trt_double import T4, FakeTensorRT


class _Running:
    """A service whose process is up (the agent is busy building its engine)."""

    def restart(self) -> None: ...

    def stop(self) -> None: ...

    def is_running(self) -> bool:
        return True


def _store(tmp_path: Path, bundle: Path, source: str | None) -> tuple[DeviceStore, str]:
    store = DeviceStore(tmp_path / "root")
    store.init(AgentConfig(device_name="t4-01", source=source, report_interval_s=60))
    m = store.stage(bundle)
    store.activate(m.release_name)
    return store, m.release_name


def test_run_agent_builds_and_accepts_before_the_first_frame(trt_bundle: Path, data_dir: Path, tmp_path: Path) -> None:
    store, release = _store(tmp_path, trt_bundle, f"file:{data_dir / 'video' / 'bikes.mp4'}")
    trt = FakeTensorRT()
    rc = run_agent(store, max_frames=3, tensorrt_options={"backend": trt, "probe": lambda: T4})
    assert rc == 0, read_health(store)
    assert read_health(store)["state"] == "finished"  # type: ignore[index]
    assert len(trt.builds) == 1 and list((store.root / "engines").glob("*/plan"))
    engine = trt.engines[0]
    # 8 reference samples (acceptance), 1 warm-up, then 3 camera frames: nothing served before acceptance
    assert engine.batches == [1] * 12
    reports = [r for _, r in pending_reports(store)]
    assert reports and reports[-1]["runtime"] == "tensorrt" and sum(r["frames"] for r in reports) == 3

    # a restart reuses the cached engine: no second build
    again = FakeTensorRT()
    assert run_agent(store, max_frames=1, tensorrt_options={"backend": again, "probe": lambda: T4}) == 0
    assert again.builds == []


def test_rejected_engine_without_tvm_fails_activation_with_the_reason(trt_bundle: Path, tmp_path: Path) -> None:
    store, release = _store(tmp_path, trt_bundle, None)
    rc = run_agent(store, tensorrt_options={"backend": FakeTensorRT(perturb=0.5), "probe": lambda: T4})
    health = read_health(store)
    assert rc != 0 and health is not None and health["state"] == "failed"
    assert health["error"]["code"] == "engine-rejected" and "top-1 agreement" in health["error"]["message"]


def _report_build(store: DeviceStore, release: str, seconds: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        write_health(store, release, "building-engine", elapsed_s=round(time.monotonic() - t0, 1))
        time.sleep(0.1)
    write_health(store, release, "ready", runtime={"runtime": "tensorrt", "engine": "built", "build_s": seconds})


def test_prebuild_waits_for_the_engine_build_and_plain_push_times_out(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path / "root")
    store.init(AgentConfig())
    builder = threading.Thread(target=_report_build, args=(store, "r1", 1.5))
    builder.start()
    health = wait_healthy(store, _Running(), "r1", timeout=0.5, build_timeout=10)
    builder.join()
    assert health["state"] == "ready" and health["runtime"]["build_s"] == 1.5

    builder = threading.Thread(target=_report_build, args=(store, "r2", 1.5))
    builder.start()
    with pytest.raises(TimeoutError, match="still building .* --prebuild"):
        wait_healthy(store, _Running(), "r2", timeout=0.5)
    builder.join()


def test_agent_deploy_takes_a_build_timeout() -> None:
    args = _parser().parse_args(["deploy", "b.edb", "--timeout", "60", "--build-timeout", "1800"])
    assert args.build_timeout == 1800.0
    assert _parser().parse_args(["deploy", "b.edb"]).build_timeout is None
