"""`edgedeploy build --runtime tensorrt`: the issue's acceptance command, run for real (no TensorRT needed)."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from edgedeploy.compile.int8.qdq_reference import reference_outputs
from edgedeploy_agent.bundle import extract_bundle
from tests.helpers import Cli, assert_one_line_error

MODEL = "models/mobilenet_v1_0.25_224.onnx"


@pytest.mark.compile
def test_acceptance_command_writes_qdq_profiles_references_and_no_plan(
    cli: Cli, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "t4-trt.edb"
    r = cli(
        "build", str(data_dir / MODEL), "--profile", "t4", "--runtime", "tensorrt", "--int8",
        "--calibration", str(data_dir / "imagenet-sample"), "--batch", "1:8:32", "-o", str(out),
    )  # fmt: skip
    assert r.code == 0, r.err
    r = cli("inspect", str(out), "--json")
    assert r.code == 0, r.err
    m = json.loads(r.out)
    assert m["target"]["runtime"] == "tensorrt" and m["target"]["device"] == "cuda" and m["target"]["cuda_sm"] == 75
    roles = {a["role"]: a["path"] for a in m["artifacts"]}
    assert roles == {"qdq-onnx": "model.qdq.onnx", "tensorrt-reference": "reference.npz"}  # what the device needs
    assert [h["role"] for h in m["host_files"]] == ["onnx-model"] and m["host_store"]["missing"] == []
    assert not any(a["path"].endswith((".plan", ".engine", ".trt", ".so")) for a in m["artifacts"])
    trt = m["tensorrt"]
    assert trt["onnx"] == "model.qdq.onnx" and trt["precision"] == "int8-qdq"
    assert trt["profiles"] == [
        [{"input": "input", "min": [1, 3, 224, 224], "opt": [8, 3, 224, 224], "max": [32, 3, 224, 224]}]
    ]
    assert trt["workspace_bytes"] == 1 << 30 and trt["reference"] == "reference.npz"
    assert m["quantization"]["precision"] == "int8" and m["quantization"]["options"]["producer"] == "tensorrt_qdq"

    rel = tmp_path / "rel"
    extract_bundle(out, rel)
    qdq = onnx.load(str(rel / "model.qdq.onnx"))
    # symmetric: every Q/DQ zero point is 0 (TensorRT supports no other), and the batch stays dynamic
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    zps = [n.input[2] for n in qdq.graph.node if n.op_type == "QuantizeLinear" and len(n.input) > 2]
    assert zps and all(not inits[z].any() for z in zps)
    assert inits[zps[0]].dtype == np.int8
    assert not qdq.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_value")
    # the reference outputs are the exact INT8 outputs of the shipped Q/DQ model on the shipped inputs
    with np.load(rel / "reference.npz") as z:
        x = z["input:input"].astype(np.float32)
        want = z["output:MobilenetV1/Predictions/Reshape_1"]
    assert x.shape == (8, 3, 224, 224) and want.shape == (8, 1001)
    np.testing.assert_array_equal(reference_outputs(qdq, x)[0], want)
    # checked a second way, on any CPU: onnxruntime's fake-quant float32 run of the same Q/DQ model (no
    # integer kernels, so no CPU-dependent saturation) rounds differently, as an engine would, and passes the
    # acceptance the device will apply
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    fake_quant = ort.InferenceSession(str(rel / "model.qdq.onnx"), so).run(None, {"input": x})[0]
    assert np.abs(fake_quant - want).max() <= trt["atol"]
    assert np.mean(np.argmax(fake_quant, axis=1) == np.argmax(want, axis=1)) >= trt["min_top1_agreement"]
    # ... and mostly what the FP32 model predicts; the tolerance is the FP32 outputs' distance from them
    # (the build's FP32 run is unoptimized too; its float32 kernels still differ in the last bits between CPUs,
    # AVX2 against AVX-512, and the stored atol is rounded to 6 digits, hence 1e-5 and not 1e-6)
    fp32 = ort.InferenceSession(str(data_dir / MODEL), so).run(None, {"input": x})[0]
    assert np.mean(np.argmax(fp32, axis=1) == np.argmax(want, axis=1)) >= 0.6
    assert trt["atol"] == pytest.approx(np.abs(fp32 - want).max(), abs=1e-5)
    agree = trt["reference_fp32_top1_agreement"]
    assert agree >= 0.6 and trt["reference_fp32_samples"] == 64
    assert len(set(np.argmax(want, axis=1).tolist())) > 1  # real images, not one constant answer

    r = cli("inspect", str(out))
    assert r.code == 0 and "engine built on the device" in r.out, r.out
    assert f"reference vs FP32 top-1 at build: {agree:.0%}" in r.out


@pytest.mark.compile
def test_build_refuses_references_that_disagree_with_fp32(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    """Activations clipped at their median: the Q/DQ model is garbage, so the build writes nothing."""
    out = tmp_path / "bad.edb"
    r = cli(
        "build", str(data_dir / MODEL), "--profile", "t4", "--runtime", "tensorrt", "--int8",
        "--calibration", str(data_dir / "imagenet-sample"), "--method", "percentile", "--percentile", "50",
        "-o", str(out),
    )  # fmt: skip
    assert_one_line_error(r, 2, "reference samples")
    assert not out.exists()


def test_tensorrt_build_refuses_bad_options(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    model = str(data_dir / MODEL)
    calib = ["--int8", "--calibration", str(data_dir / "imagenet-sample")]
    out = ["-o", str(tmp_path / "x.edb")]
    base = [model, "--profile", "t4", "--runtime", "tensorrt"]
    assert_one_line_error(cli("build", *base, *out), 2, "add --int8")
    assert_one_line_error(cli("build", *base, *calib, "--batch", "8:1:32", *out), 2, "MIN <= OPT <= MAX")
    assert_one_line_error(cli("build", *base, *calib, "--batch", "a:b", *out), 2, "--batch takes")
    assert_one_line_error(cli("build", model, "--profile", "t4", "--batch", "1:8:32", *out), 2, "one static batch size")
    assert_one_line_error(cli("build", model, "--profile", "t4", "--runtime", "onnx", *out), 2, "unknown runtime")
    cpu = [model, "--profile", "cpu-x86_64", "--runtime", "tensorrt", *calib, *out]
    assert_one_line_error(cli("build", *cpu), 2, "needs a CUDA profile")
    assert not (tmp_path / "x.edb").exists()
