"""The TensorRT runtime's logic, run here against a real TensorRT bundle and the TensorRT test double.

What is real: the bundle (built by the host from MobileNet and ImageNet samples), the engine cache on
disk, locking, the acceptance comparison, the TVM fallback (a real TVM library). What is a double:
TensorRT itself (tests/agent/trt_double.py); the same code path with real TensorRT is marked `tensorrt`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from edgedeploy_agent.bundle import (
    Manifest,
    Preprocess,
    Target,
    describe_artifact,
    extract_bundle,
    read_manifest,
    write_bundle,
)
from edgedeploy_agent.errors import RuntimeLoadError
from edgedeploy_agent.runtime import FallbackRuntime, load_runtime
from edgedeploy_agent.runtime.engine_cache import engine_key, engine_key_fields
from edgedeploy_agent.runtime.tensorrt import EngineRejected, TensorRTRuntime
from edgedeploy_agent.sidecar.cuda_probe import CudaDevice, l4t_release, probe_cuda
from edgedeploy_agent.sidecar.trt_backend import PolygraphyBackend, build_options
from tests.agent.trt_double import T4, XAVIER, FakeTensorRT
from tests.helpers import require, require_host, require_module


@pytest.fixture(scope="module")
def trt_release(trt_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    """The real `--runtime tensorrt` MobileNet bundle, unpacked."""
    rel = tmp_path_factory.mktemp("trt") / "rel"
    return rel, extract_bundle(trt_bundle, rel)


def _open(rel: tuple[Path, Manifest], engines: Path, trt: FakeTensorRT, **kw: object) -> TensorRTRuntime:
    gpu = trt.gpu
    return TensorRTRuntime(rel[0], rel[1], engines, backend=trt, probe=lambda: gpu, heartbeat_s=0.01, **kw)  # type: ignore[arg-type]


def test_builds_at_activation_then_reuses_the_cached_engine(trt_release, tmp_path: Path) -> None:
    events: list[dict[str, object]] = []
    trt = FakeTensorRT()
    rt = _open(trt_release, tmp_path / "engines", trt, progress=events.append)
    d = rt.describe()
    assert len(trt.builds) == 1 and d["engine"] == "built" and d["build_s"] >= 0
    assert d["acceptance"]["passed"] and d["acceptance"]["top1_agreement"] == 1.0 and d["acceptance"]["samples"] == 8
    assert (d["gpu_name"], d["compute_capability"], d["tensorrt"]) == ("Tesla T4", "7.5", "10.16.1.11")
    states = [e["state"] for e in events]
    assert states[0] == "building-engine" and "engine-built" in states and states[-1] == "accepting"
    assert any("phase" in e for e in events)  # TensorRT's build phases reach health.json
    entry = tmp_path / "engines" / rt.key
    meta = json.loads((entry / "plan.json").read_text())
    assert meta["fields"]["tensorrt"] == "10.16.1.11" and meta["fields"]["profiles"][0][0]["max"] == [32, 3, 224, 224]
    assert not list((tmp_path / "engines").glob(".tmp-*"))  # written atomically, nothing left behind
    # acceptance ran batch 1 (the profile's min) on every reference sample
    assert trt.engines[0].batches == [1] * 8

    again = FakeTensorRT()
    rt2 = _open(trt_release, tmp_path / "engines", again)
    assert again.builds == [] and rt2.describe()["engine"] == "cached" and rt2.key == rt.key
    x = np.zeros((1, 3, 224, 224), np.float32)
    assert rt2.run([x])[0].shape == (1, 1001)


def test_engine_key_covers_everything_a_plan_depends_on(trt_release) -> None:
    rel, m = trt_release
    s = m.tensorrt
    assert s is not None
    dev = {**T4.as_dict(), "l4t": None}
    base = engine_key(engine_key_fields(m, s, "a" * 64, "10.16.1.11", dev))
    assert base == engine_key(engine_key_fields(m, s, "a" * 64, "10.16.1.11", dict(dev)))
    variants = [
        engine_key_fields(m, s, "a" * 64, "10.16.1.12", dev),
        engine_key_fields(m, s, "b" * 64, "10.16.1.11", dev),
        engine_key_fields(m, s, "a" * 64, "10.16.1.11", {**dev, "gpu_name": "Tesla T4 (MIG)"}),
        engine_key_fields(m, s, "a" * 64, "10.16.1.11", {**dev, "compute_capability": "8.0"}),
        engine_key_fields(m, s, "a" * 64, "10.16.1.11", {**dev, "cuda_driver": "12.8"}),
        engine_key_fields(m, s, "a" * 64, "10.16.1.11", {**dev, "cuda_runtime": "12.8"}),
        engine_key_fields(m, s, "a" * 64, "10.16.1.11", {**dev, "l4t": "R35 (release), REVISION: 4.1"}),
        engine_key_fields(m, s.model_copy(update={"workspace_bytes": 1 << 29}), "a" * 64, "10.16.1.11", dev),
        engine_key_fields(m, s.model_copy(update={"fp16": False}), "a" * 64, "10.16.1.11", dev),
        engine_key_fields(m, s.model_copy(update={"builder_optimization_level": 5}), "a" * 64, "10.16.1.11", dev),
        engine_key_fields(
            m,
            s.model_copy(update={"profiles": [[s.profiles[0][0].model_copy(update={"max": [16, 3, 224, 224]})]]}),
            "a" * 64,
            "10.16.1.11",
            dev,
        ),  # fmt: skip
        engine_key_fields(
            m.model_copy(update={"quantization": m.quantization.model_copy(update={"float_layers": ["conv0"]})}),
            s,
            "a" * 64,
            "10.16.1.11",
            dev,
        ),  # fmt: skip
    ]
    keys = {engine_key(f) for f in variants}
    assert len(keys) == len(variants) and base not in keys


def test_other_tensorrt_or_gpu_or_undeserializable_plan_means_rebuild(trt_release, tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    first = _open(trt_release, engines, FakeTensorRT("10.16.1.11"))
    other = FakeTensorRT("10.3.0.26")
    second = _open(trt_release, engines, other)
    assert len(other.builds) == 1 and second.key != first.key
    # same key, but TensorRT refuses the stored plan (deserialize returns None): build again, replace it
    (engines / first.key / "plan").write_bytes(b"garbage")
    meta = json.loads((engines / first.key / "plan.json").read_text())
    meta["plan_sha256"] = hashlib.sha256(b"garbage").hexdigest()
    (engines / first.key / "plan.json").write_text(json.dumps(meta))
    trt = FakeTensorRT("10.16.1.11")
    again = _open(trt_release, engines, trt)
    # loads: the cached plan (refused), again under the lock (refused), the fresh plan
    assert len(trt.builds) == 1 and trt.loads == 3 and again.describe()["engine"] == "built"
    assert (engines / first.key / "plan").read_bytes() != b"garbage"


def test_timing_cache_is_per_tensorrt_version_and_gpu(trt_release, tmp_path: Path) -> None:
    rel, m = trt_release
    engines = tmp_path / "engines"
    t1 = FakeTensorRT()
    _open(trt_release, engines, t1)
    assert t1.builds[0]["timing_cache_reused"] is False
    # another engine (other workspace) on the same TensorRT + GPU reuses the timing cache
    assert m.tensorrt is not None
    m2 = m.model_copy(update={"tensorrt": m.tensorrt.model_copy(update={"workspace_bytes": 1 << 28})})
    t2 = FakeTensorRT()
    rt = TensorRTRuntime(rel, m2, engines, backend=t2, probe=lambda: T4)
    assert t2.builds[0]["timing_cache_reused"] is True and rt.describe()["timing_cache_reused"] is True
    t3 = FakeTensorRT("8.5.2.2", gpu=XAVIER)
    _open(trt_release, engines, t3)
    assert t3.builds[0]["timing_cache_reused"] is False
    assert sorted(p.name for p in (engines / "timing").iterdir()) == [
        "trt-10.16.1.11-Tesla_T4.cache",
        "trt-8.5.2.2-Xavier.cache",
    ]


def test_version_branches_only_where_85_10_and_11_differ(trt_release) -> None:
    s = trt_release[1].tensorrt
    assert s is not None
    assert build_options("8.5.2.2", s) == ({}, {"builder_optimization_level": 3, "int8": True, "fp16": True})
    assert build_options("10.16.1.11", s) == ({}, {"builder_optimization_level": 3, "int8": True, "fp16": True})
    assert build_options("11.4.0.106", s) == ({"strongly_typed": True}, {"builder_optimization_level": 3})
    assert build_options("10.3.0", s.model_copy(update={"fp16": False}))[1]["fp16"] is False
    with pytest.raises(RuntimeLoadError, match="8.5 or newer"):
        build_options("8.4.3.1", s)
    with pytest.raises(RuntimeLoadError, match="8.5 or newer"):
        build_options("7.1.3.4", s)


def test_failed_acceptance_marks_the_engine_bad_and_is_not_retried(trt_release, tmp_path: Path) -> None:
    engines = tmp_path / "engines"
    broken = FakeTensorRT(perturb=0.5)
    with pytest.raises(EngineRejected, match="failed acceptance on 8 reference samples: top-1 agreement") as e:
        _open(trt_release, engines, broken)
    assert e.value.code == "engine-rejected"
    bad = next(engines.glob("*/bad.json"))
    assert json.loads(bad.read_text())["passed"] is False
    # the next activation does not build (minutes on a Xavier) an engine known to be bad
    fresh = FakeTensorRT()
    with pytest.raises(EngineRejected, match="rejected before"):
        _open(trt_release, engines, fresh)
    assert fresh.builds == [] and fresh.loads == 0


def test_no_cuda_device_stops_before_tensorrt_is_touched(trt_release, tmp_path: Path) -> None:
    def no_gpu() -> CudaDevice:
        raise RuntimeLoadError("no CUDA driver on this device")

    def backend() -> FakeTensorRT:
        raise AssertionError("TensorRT must not be touched without a CUDA device")

    with pytest.raises(RuntimeLoadError, match="no CUDA driver"):
        TensorRTRuntime(trt_release[0], trt_release[1], tmp_path, backend=backend, probe=no_gpu)


def test_probe_here_without_a_driver_is_one_clear_error() -> None:
    nvidia = Path("/dev/nvidia0").exists() or Path("/dev/nvhost-ctrl").exists()
    require("NO_NVIDIA", "this machine has an NVIDIA device" if nvidia else None)
    with pytest.raises(RuntimeLoadError) as e:
        probe_cuda()
    assert "CUDA" in e.value.message and e.value.hint


def test_l4t_release_from_a_jetson_fixture_tree(tmp_path: Path) -> None:
    assert l4t_release(tmp_path) is None
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nv_tegra_release").write_text(
        "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
        "DATE: Tue Aug  1 19:57:35 UTC 2023\n# KERNEL_VARIANT: oot\n"
    )
    assert l4t_release(tmp_path) == "R35 (release), REVISION: 4.1"


def test_concurrent_activations_build_once_under_the_lock(trt_release, tmp_path: Path) -> None:
    trts = [FakeTensorRT(), FakeTensorRT()]
    errors: list[BaseException] = []

    def activate(t: FakeTensorRT) -> None:
        try:
            _open(trt_release, tmp_path / "engines", t)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=activate, args=(t,)) for t in trts]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and sum(len(t.builds) for t in trts) == 1


@pytest.fixture(scope="module")
def both_runtimes_release(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Manifest]:
    """MNIST with a real CPU TVM library and TensorRT artifacts in one bundle (runtime tensorrt)."""
    require_host()
    from edgedeploy.api import build, build_tensorrt
    from edgedeploy.compile.cards import ModelCard
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.tensorrt_artifacts import TensorRTOptions

    tmp = tmp_path_factory.mktemp("both")
    model = data_dir / "models" / "mnist-8_opset13.onnx"
    card = ModelCard(name="mnist", preprocess=Preprocess(color="gray"))
    tvm = build(model, "cpu-x86_64", tmp / "tvm.edb", card)
    calib = tmp / "calib.npy"
    np.save(calib, np.random.default_rng(0).uniform(0, 255, (16, 1, 28, 28)).astype(np.float32))
    trt = build_tensorrt(model, "t4", tmp / "trt.edb", card, Int8Config(calibration=calib), TensorRTOptions())
    extract_bundle(tvm.bundle, tmp / "tvm")
    extract_bundle(trt.bundle, tmp / "trt")
    files = {a.path: tmp / "trt" / a.path for a in trt.manifest.artifacts}
    files["model.so"] = tmp / "tvm" / "model.so"
    roles = {a.path: a.role for a in trt.manifest.artifacts} | {"model.so": "tvm-library"}
    target = Target(arch="x86_64", device="cpu", runtime="tensorrt", runtime_abi=tvm.manifest.target.runtime_abi)
    artifacts = [describe_artifact(p, roles[n], n) for n, p in sorted(files.items())]
    m = trt.manifest.model_copy(update={"target": target, "artifacts": artifacts})
    both = write_bundle(tmp / "both.edb", m, files)
    extract_bundle(both, tmp / "rel")
    return tmp / "rel", read_manifest(both)


def test_rejected_engine_falls_back_to_tvm_and_says_why(both_runtimes_release, tmp_path: Path) -> None:
    rel, m = both_runtimes_release
    events: list[dict[str, object]] = []
    opts = {"backend": FakeTensorRT(perturb=0.5), "probe": lambda: T4}
    rt = load_runtime(rel, m, engine_root=tmp_path / "engines", progress=events.append, tensorrt_options=opts)
    assert isinstance(rt, FallbackRuntime) and rt.name == "tvm"
    d = rt.describe()
    assert d["fallback_from"] == "tensorrt" and d["fallback_reason"]["code"] == "engine-rejected"
    assert events[-1]["state"] == "fallback" and "top-1 agreement" in str(events[-1]["reason"])
    x = np.random.default_rng(1).uniform(0, 255, (1, 1, 28, 28)).astype(np.float32)
    assert rt.run([x])[0].shape == (1, 10)

    # no GPU at all: the same fallback, with that reason
    def no_gpu() -> CudaDevice:
        raise RuntimeLoadError("no CUDA driver on this device")

    rt = load_runtime(rel, m, engine_root=tmp_path / "e2", tensorrt_options={"probe": no_gpu})
    assert rt.describe()["fallback_reason"]["message"] == "no CUDA driver on this device"


def test_good_engine_serves_and_tensorrt_only_bundle_fails_without_fallback(
    both_runtimes_release, trt_release, tmp_path: Path
) -> None:
    rel, m = both_runtimes_release
    opts = {"backend": FakeTensorRT(), "probe": lambda: T4}
    rt = load_runtime(rel, m, engine_root=tmp_path / "engines", tensorrt_options=opts)
    assert rt.name == "tensorrt" and rt.describe()["acceptance"]["passed"]
    with pytest.raises(EngineRejected):
        load_runtime(
            trt_release[0], trt_release[1], engine_root=tmp_path / "e2",
            tensorrt_options={"backend": FakeTensorRT(perturb=0.5), "probe": lambda: T4},
        )  # fmt: skip


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_real_tensorrt_builds_accepts_and_caches(trt_release, tmp_path: Path) -> None:
    """Where TensorRT and a GPU exist: the production backend (Polygraphy loaders, named-tensor v3 path)."""
    rt = TensorRTRuntime(trt_release[0], trt_release[1], tmp_path / "engines")
    d = rt.describe()
    assert d["engine"] == "built" and d["acceptance"]["passed"], d
    x = np.zeros((4, 3, 224, 224), np.float32)  # inside the 1:8:32 profile
    assert rt.run([x])[0].shape == (4, 1001)
    assert TensorRTRuntime(trt_release[0], trt_release[1], tmp_path / "engines").describe()["engine"] == "cached"


def test_settings_defaults_are_in_the_manifest(trt_release) -> None:
    from edgedeploy.compile.tensorrt_artifacts import TensorRTOptions  # trt_release required the host

    s = trt_release[1].tensorrt
    assert s is not None and dataclasses.asdict(TensorRTOptions()).keys() >= {"batch", "workspace_mib"}
    assert s.min_top1_agreement == TensorRTOptions().min_top1_agreement == 0.75
    assert s.builder_optimization_level == 3
    # the build measured the tolerance: the FP32 outputs' distance from the reference, well above a correct
    # engine's (0.065 at most on 500 images) and far below a broken one's
    assert 0.065 < s.atol < 0.5 and s.reference_fp32_samples == 16


def test_tensorrt_and_polygraphy_are_imported_lazily() -> None:
    script = (
        "import sys, edgedeploy_agent.runtime.tensorrt, edgedeploy_agent.sidecar.trt_backend\n"
        "print(','.join(sorted(n for n in sys.modules if n.split('.')[0] in ('tensorrt', 'polygraphy'))))"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "", p.stderr


def test_production_backend_without_tensorrt_is_one_clear_error() -> None:
    # Polygraphy itself imports without TensorRT (lazy imports)
    require_module("polygraphy.backend.trt", "DEV_PACKAGES", "pip install polygraphy")
    require("NO_TENSORRT", "TensorRT is installed here" if importlib.util.find_spec("tensorrt") else None)
    with pytest.raises(RuntimeLoadError, match="TensorRT is not usable here") as e:
        PolygraphyBackend()
    assert e.value.hint and "polygraphy" in e.value.hint


class _PolygraphyDouble:
    """Polygraphy's EngineBytesFromNetwork as it treats save_timing_cache: a lock file beside the path, then
    the cache written in place; `fail` breaks the build off after half of the cache is written."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def EngineBytesFromNetwork(self, network: object, config: object, save_timing_cache: str | None = None):  # noqa: N802
        def build() -> bytes:
            if save_timing_cache is not None:
                Path(save_timing_cache + ".lock").touch()
                with open(save_timing_cache, "wb") as f:
                    f.write(b"new ")
                    if self.fail:
                        raise RuntimeError("power cut")
                    f.write(b"cache")
            return b"plan"

        return build


def test_the_timing_cache_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    cache = tmp_path / "timing" / "trt-10-T4.cache"
    cache.parent.mkdir()
    cache.write_bytes(b"old cache")
    backend = object.__new__(PolygraphyBackend)  # no TensorRT here: only the cache handling is real
    backend._poly = _PolygraphyDouble(fail=True)
    with pytest.raises(RuntimeError):
        backend._build_saving_cache(None, None, cache)
    assert cache.read_bytes() == b"old cache" and os.listdir(cache.parent) == [cache.name]
    backend._poly = _PolygraphyDouble()
    assert backend._build_saving_cache(None, None, cache) == b"plan"
    assert cache.read_bytes() == b"new cache" and os.listdir(cache.parent) == [cache.name]
