"""Stored MetaSchedule databases: trials go where the time is, every stored record agrees with the default
schedule, and builds apply the databases (the manifest names the kernels that came from one)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgedeploy.api import build, evaluate
from edgedeploy.compile.int8_build import Int8Config
from edgedeploy.compile.package import load_card
from edgedeploy.compile.quantize import QuantizeOptions
from edgedeploy.compile.tuning import allocate_trials, database_dir, has_database
from edgedeploy.datasets import load_calibration
from edgedeploy_agent.bundle import extract_bundle, read_manifest
from edgedeploy_agent.runtime.tvm import TvmRuntime

REPO = Path(__file__).resolve().parents[2]
MNV1_CARD = REPO / "examples" / "cards" / "mobilenet_v1_0.25_224.toml"


def test_trials_follow_measured_time() -> None:
    costs = {"big": 4.6, "mid": 1.2, "small": 0.5, "tiny": 0.05}
    plan = allocate_trials(costs, 160)
    assert list(plan) == ["big", "mid", "small"]  # most expensive first; under 2 % of the time gets none
    assert plan["big"] > plan["mid"] > plan["small"] >= 8
    assert sum(plan.values()) <= 160 and all(n % 8 == 0 for n in plan.values())
    assert allocate_trials(costs, 8) == {"big": 8}
    assert allocate_trials({}, 100) == {} and allocate_trials(costs, 0) == {}


def _database(model: Path, precision: str) -> Path:
    import hashlib

    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    db = database_dir("cpu-x86_64", f"{sha[:16]}-{precision}", REPO / "profiles" / "tuning")
    if not has_database(db):
        pytest.skip(f"no stored {precision} database for {model.name}")
    return db


def test_tuned_fp32_bundle_uses_the_database_and_matches_onnxruntime(data_dir: Path, tmp_path: Path) -> None:
    model = data_dir / "models" / "mobilenet_v1_0.25_224.onnx"
    db = _database(model, "fp32")
    card = load_card(MNV1_CARD)
    res = build(model, "cpu-x86_64", tmp_path / "f.edb", card)
    tuning = res.manifest.provenance.options["tuning"]
    assert tuning.startswith(f"cpu-x86_64/{db.name}: ") and "fused_conv2d" in tuning
    assert res.manifest.target.cpu_features and "avx2" in res.manifest.target.cpu_features
    m = extract_bundle(res.bundle, tmp_path / "rel")
    tvm_rt = TvmRuntime(tmp_path / "rel", m)
    sess = ort.InferenceSession(str(tmp_path / "rel" / m.artifact("onnx-model").path))
    x = load_calibration(data_dir / "imagenet-sample", card.preprocess, m.inputs[0], 8, "evaluation")
    for i in range(len(x)):
        got = np.asarray(tvm_rt.run([x[i : i + 1]])[0])
        want = sess.run(None, {m.inputs[0].name: x[i : i + 1]})[0]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
    # an input that is not 64-byte aligned (AVX2 code faulted on one before the runtime realigned it)
    raw = np.empty(x[:1].nbytes + 128, dtype=np.uint8)
    start = -raw.ctypes.data % 64 + 4
    odd = raw[start : start + x[:1].nbytes].view(np.float32).reshape(x[:1].shape)
    odd[...] = x[:1]
    assert odd.ctypes.data % 64 == 4
    np.testing.assert_array_equal(np.asarray(tvm_rt.run([odd])[0]), np.asarray(tvm_rt.run([x[:1]])[0]))


def test_tuned_int8_bundle_uses_the_database_and_agrees_with_onnxruntime(data_dir: Path, tmp_path: Path) -> None:
    """The default quantization (the one the database was tuned for) on the whole evaluation half."""
    model = data_dir / "models" / "mobilenet_v1_0.25_224.onnx"
    db = _database(model, "int8")
    images = data_dir / "imagenet-sample"
    cfg = Int8Config(calibration=images, eval_data=images, options=QuantizeOptions())
    res = build(model, "cpu-x86_64", tmp_path / "i.edb", load_card(MNV1_CARD), int8=cfg)
    tuning = read_manifest(res.bundle).provenance.options["tuning"]
    assert tuning.startswith(f"cpu-x86_64/{db.name}: ") and "fused_conv2d" in tuning
    ev = evaluate(res.bundle, images, load_card(MNV1_CARD))
    assert ev["split"] == "evaluation" and ev["images"] == 230
    assert ev["top1_agreement_bundle_vs_onnxruntime_int8"] >= 99.0
