"""`edgedeploy build --runtime tensorrt`: the issue's acceptance command, run for real (no TensorRT needed)."""

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from edgedeploy_agent.bundle import extract_bundle
from tests.helpers import Cli, assert_one_line_error

MODEL = "models/mobilenet_v1_0.25_224.onnx"


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
    # the reference outputs are onnxruntime's outputs of the shipped Q/DQ model on the shipped inputs
    with np.load(rel / "reference.npz") as z:
        x = z["input:input"].astype(np.float32)
        want = z["output:MobilenetV1/Predictions/Reshape_1"]
    assert x.shape == (8, 3, 224, 224) and want.shape == (8, 1001)
    sess = ort.InferenceSession(str(rel / "model.qdq.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input": x})[0]
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert len(set(np.argmax(want, axis=1).tolist())) > 1  # real images, not one constant answer

    r = cli("inspect", str(out))
    assert r.code == 0 and "engine built on the device" in r.out, r.out


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
