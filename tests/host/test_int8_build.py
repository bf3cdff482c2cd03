"""INT8 builds end to end: real calibration data, real TVM compiles, the accuracy gate, `edgedeploy eval`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from edgedeploy.api import build, evaluate
from edgedeploy.compile.cards import ModelCard, load_card
from edgedeploy.compile.int8.build import AccuracyGateError, Int8Config
from edgedeploy.compile.int8.datasets import load_calibration
from edgedeploy.compile.int8.quantize import QuantizeOptions, quantizable_layers, quantize_qdq
from edgedeploy.compile.int8.rewrite import rewrite_int8
from edgedeploy_agent.bundle import Preprocess, TensorSpec, read_manifest
from tests.helpers import Cli, assert_one_line_error
from tests.host.models import run_on_cpu

REPO = Path(__file__).resolve().parents[2]
MNIST_CARD = REPO / "examples" / "cards" / "mnist-8.toml"
MNV1_CARD = REPO / "examples" / "cards" / "mobilenet_v1_0.25_224.toml"


def _mnist_build_args(data_dir: Path, out: Path) -> list[str]:
    mnist = str(data_dir / "mnist")
    model = str(data_dir / "models" / "mnist-8_opset13.onnx")
    return ["build", model, "-p", "cpu-x86_64", "--card", str(MNIST_CARD), "--int8", "--calibration", mnist,
            "--samples", "64", "--eval", mnist, "-o", str(out)]  # fmt: skip


@pytest.mark.compile
def test_mnist_int8_bundle_gate_and_eval(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "mnist-int8.edb"
    r = cli(*_mnist_build_args(data_dir, out), "--max-top1-drop", "0.1")
    assert r.code == 0, r.err
    assert "drop" in r.out and "float layers: none" in r.out
    m = read_manifest(out)
    assert {a.role for a in m.artifacts} == {"tvm-library"}  # source and Q/DQ model stay in the build store
    assert {h.role: h.name for h in m.host_files} == {
        "onnx-model": "mnist-8_opset13.onnx",
        "qdq-onnx": "model.qdq.onnx",
    }
    q = m.quantization
    assert (q.precision, q.method, q.calibration_samples, q.float_layers, q.float_in_runtime) == (
        "int8", "minmax", 64, [], [],
    )  # fmt: skip
    assert q.calibration and q.calibration.endswith("(split: calibration)")
    assert q.evaluation and q.evaluation.endswith("(split: evaluation)")
    assert q.accuracy["top1_drop"] <= 0.1 and q.accuracy["eval_images"] > 4000
    r = cli("eval", str(out), "--data", str(data_dir / "mnist"), "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)
    assert res["split"] == "evaluation" and res["images"] == q.accuracy["eval_images"]
    assert res["top1_drop"] <= 0.1
    assert res["top1_agreement_bundle_vs_int8_reference"] >= 99.0
    assert res["tvm_bundle"]["top1"] > 98.0


@pytest.mark.compile
def test_gate_failure_is_one_clear_line(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    r = cli(*_mnist_build_args(data_dir, tmp_path / "x.edb"), "--max-top1-drop", "-50")
    assert_one_line_error(r, code=1, contains="INT8 top-1 drops")
    assert "--auto-fallback" in r.err and not (tmp_path / "x.edb").exists()
    r = cli(*_mnist_build_args(data_dir, tmp_path / "x.edb"), "--max-top1-drop", "-50", "--auto-fallback")
    assert_one_line_error(r, code=1, contains="even with all 3 layers in float")


@pytest.mark.compile
def test_bad_int8_input_is_one_clear_line(cli: Cli, data_dir: Path, tmp_path: Path) -> None:
    model = str(data_dir / "models" / "mnist-8_opset13.onnx")
    base = ["build", model, "-p", "cpu-x86_64", "--card", str(MNIST_CARD), "-o", str(tmp_path / "o.edb")]
    assert_one_line_error(cli(*base, "--int8"), code=2, contains="--calibration")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(cli(*base, "--int8", "--calibration", str(empty)), code=2, contains=str(empty))
    r = cli(*base, "--int8", "--calibration", str(data_dir / "mnist"), "--method", "magic")
    assert_one_line_error(r, code=2, contains="magic")
    r = cli(*base, "--int8", "--calibration", str(data_dir / "mnist"), "--keep-float", "NoSuchLayer")
    assert_one_line_error(r, code=2, contains="NoSuchLayer")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 28, 28])
    relu = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y]))
    onnx.save(relu, tmp_path / "relu.onnx")
    r = cli("build", str(tmp_path / "relu.onnx"), "-p", "cpu-x86_64", "--mean", "0", "--std", "1", "--int8",
            "--calibration", str(data_dir / "mnist"), "-o", str(tmp_path / "r.edb"))  # fmt: skip
    assert_one_line_error(r, code=2, contains="no quantizable layers")
    r = cli("eval", str(tmp_path / "missing.edb"), "--data", str(data_dir / "mnist"))
    assert_one_line_error(r, code=2, contains="missing.edb")


def test_rewrite_makes_integer_convolutions(data_dir: Path) -> None:
    model = onnx.load(data_dir / "models" / "mnist-8_opset13.onnx")
    spec = TensorSpec(name="Input3", shape=[1, 1, 28, 28], layout="NCHW")
    calib = load_calibration(data_dir / "mnist", Preprocess(color="gray"), spec, 32)
    for keep, integer in (((), 3), (("last",), 2)):
        qdq = quantize_qdq(model, calib, QuantizeOptions(keep_float=keep)).model
        mod = from_onnx(qdq, shape_dict={"Input3": [1, 1, 28, 28]}, keep_params_in_input=False)
        mod, report = rewrite_int8(relax.transform.DecomposeOpsForInference()(mod), quantizable_layers(qdq))
        assert len(report.integer) == integer
        text = mod.script()
        assert text.count('out_dtype="int32"') == integer and "R.round" in text
        if keep:
            assert report.float_left == ["Times212: operands are not dequantized (kept in float)"]


def _mnist_qdq(data_dir: Path, samples: int) -> tuple[onnx.ModelProto, object, np.ndarray]:
    """mnist-8 quantized on `samples` real digits, imported into Relax (decomposed); and the digits."""
    model = onnx.load(data_dir / "models" / "mnist-8_opset13.onnx")
    spec = TensorSpec(name="Input3", shape=[1, 1, 28, 28], layout="NCHW")
    calib = load_calibration(data_dir / "mnist", Preprocess(color="gray"), spec, samples)
    qdq = quantize_qdq(model, calib, QuantizeOptions()).model
    imported = relax.transform.DecomposeOpsForInference()(
        from_onnx(qdq, shape_dict={"Input3": [1, 1, 28, 28]}, keep_params_in_input=False)
    )
    return qdq, imported, calib


@pytest.mark.compile
def test_float_exact_accumulation_is_bit_identical_to_int32(data_dir: Path) -> None:
    """The CPU pipeline accumulates int8 products in float32 where the sum provably stays below 2**24:
    compiled and run, both forms give the same bytes on real images."""

    qdq, imported, calib = _mnist_qdq(data_dir, 32)
    outputs = []
    for exact in (False, True):
        mod, report = rewrite_int8(imported, quantizable_layers(qdq), float_exact=exact)
        assert len(report.integer) == 3 and report.float_left == []  # 2 convs (float32-exact) and the MatMul
        text = mod.script()
        assert text.count('out_dtype="int32"') == (1 if exact else 3)  # exact: only the MatMul stays int32
        outputs.append(run_on_cpu(mod, calib))
    assert np.array_equal(outputs[0], outputs[1])


@pytest.mark.compile
def test_max_pool_runs_on_integers(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dequantize -> max_pool2d -> quantize with one scale becomes max_pool2d on the integers: mnist's two
    poolings read int8, and the compiled graph gives the same bytes as the float pooling between Q/DQ."""

    from edgedeploy.compile.int8 import rewrite as int8_rewrite

    qdq, imported, calib = _mnist_qdq(data_dir, 16)
    outputs = []
    for integer_pool in (True, False):
        if not integer_pool:
            monkeypatch.setattr(int8_rewrite._Rewriter._cls, "_integer_max_pool", lambda self, q: None)
        mod, _ = rewrite_int8(imported, quantizable_layers(qdq))
        pools = [line for line in mod.script().splitlines() if "R.nn.max_pool2d(" in line]
        assert len(pools) == 2 and all(('dtype="float32"' not in p) == integer_pool for p in pools), pools
        outputs.append(run_on_cpu(mod, calib))
    assert np.array_equal(outputs[0], outputs[1])


@pytest.fixture(scope="module")
def mobilenet_int8(data_dir: Path, tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> Path:
    out = tmp_path_factory.mktemp("mnv1") / "mnv1-int8.edb"
    cfg = Int8Config(
        calibration=data_dir / "imagenet-sample",
        options=QuantizeOptions(samples=32),
        eval_data=data_dir / "imagenet-sample",
        eval_limit=64,
    )
    # a module fixture runs before the autouse `hermetic` one: keep the user's cache and config out here too
    # (the tests then find the bundle's source and Q/DQ model in the session's build store)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEDEPLOY_CACHE_DIR", str(build_cache))
        mp.setenv("EDGEDEPLOY_CONFIG_DIR", str(tmp_path_factory.mktemp("mnv1-config")))
        build(data_dir / "models" / "mobilenet_v1_0.25_224.onnx", "cpu-x86_64", out, load_card(MNV1_CARD), int8=cfg)
    return out


@pytest.mark.compile
def test_mobilenet_int8_bundle_agrees_with_the_reference(mobilenet_int8: Path, data_dir: Path) -> None:
    """Depthwise convolutions, asymmetric padding, per-channel scales: all 28 convs in integer."""
    m = read_manifest(mobilenet_int8)
    assert m.quantization.float_in_runtime == [] and m.quantization.accuracy["eval_images"] == 64
    res = evaluate(mobilenet_int8, data_dir / "imagenet-sample", ModelCard(), limit=100)
    assert res["split"] == "evaluation" and res["images"] == 100
    # float32 requantization against exact arithmetic: see test_tuning's tuned INT8 test for the measured spread
    assert res["top1_agreement_bundle_vs_int8_reference"] >= 93.0
    assert abs(res["top1_drop"]) < 10  # 100 images: a sanity bound; bench/int8_accuracy.py has the real numbers


@pytest.mark.compile
def test_auto_fallback_keeps_sensitive_layers_float(data_dir: Path, tmp_path: Path) -> None:
    """A deliberately weak quantization (symmetric, no bias correction, 8 samples) must fall back."""
    opts = QuantizeOptions(samples=8, symmetric_activations=True, bias_correction=False, refine=False)
    cfg = Int8Config(
        calibration=data_dir / "imagenet-sample",
        options=opts,
        eval_data=data_dir / "imagenet-sample",
        eval_limit=40,
        max_top1_drop=-100.0,
    )
    model = data_dir / "models" / "mobilenet_v1_0.25_224.onnx"
    card = load_card(MNV1_CARD)
    with pytest.raises(AccuracyGateError, match="drops"):
        build(model, "cpu-x86_64", tmp_path / "a.edb", card, int8=cfg)
    from dataclasses import replace

    from edgedeploy.compile.frontends.onnx_model import load_onnx
    from edgedeploy.compile.int8.build import quantize_model

    mdl = load_onnx(model)
    calib = load_calibration(cfg.calibration, card.preprocess, mdl.inputs[0], 8, "calibration")
    weak = quantize_model(mdl, card.preprocess, replace(cfg, max_top1_drop=None, label_offset=1), calib)
    assert weak.comparison is not None
    gate = weak.comparison.drop - 0.01  # just below what plain quantization reaches: fallback must act
    res = quantize_model(
        mdl, card.preprocess, replace(cfg, max_top1_drop=gate, auto_fallback=True, label_offset=1), calib
    )
    assert res.comparison is not None and res.comparison.drop <= gate
    assert res.fallback_tried and res.report.float_layers == res.fallback_tried
    assert np.isfinite(res.comparison.int8.top1)


@pytest.mark.compile
def test_a_classifier_with_transposed_weights_becomes_integer() -> None:
    """ONNX Gemm with transB=1 (ResNet-18's fc) imports as matmul(x, permute_dims(dequantize(W))): the rewrite
    takes the transposition into the constant, and the integer result equals the exact integer sum."""
    import tvm

    rng = np.random.default_rng(0)
    wq = rng.integers(-127, 128, (10, 64)).astype(np.int8)  # N x K, per-output-channel scales
    sw = rng.uniform(0.01, 0.02, 10).astype(np.float32)
    bb = relax.BlockBuilder()
    xq = relax.Var("xq", relax.TensorType((4, 64), "uint8"))
    with bb.function("main", [xq]):
        with bb.dataflow():
            x = bb.emit(relax.op.dequantize(xq, relax.const(0.05, "float32"), relax.const(3, "uint8")))
            w = bb.emit(
                relax.op.dequantize(relax.const(wq), relax.const(sw), relax.const(np.zeros(10, np.int8)), axis=0)
            )
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.op.permute_dims(w, [1, 0]))))
        bb.emit_func_output(out)
    mod, report = rewrite_int8(relax.transform.Normalize()(bb.get()), ["fc"])
    assert report.integer == ["fc"] and report.float_left == []
    assert 'out_dtype="int32"' in mod.script()
    x = rng.integers(0, 256, (4, 64)).astype(np.uint8)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    exact = ((x.astype(np.int64) - 3) @ wq.T.astype(np.int64)) * (0.05 * sw.astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=1e-6)


@pytest.mark.compile
def test_signed_activations_give_the_same_bytes_without_shift_kernels(data_dir: Path) -> None:
    """CUDA builds quantize activations to int8 (q - 128, zero point - 128) instead of uint8: int8_rewrite
    then has no uint8 input to shift before a convolution, and the compiled graph gives the same bytes."""

    from edgedeploy.compile.int8.rewrite import signed_activations

    qdq, imported, calib = _mnist_qdq(data_dir, 16)
    outputs, scripts = [], []
    for signed in (False, True):
        mod, report = rewrite_int8(signed_activations(imported) if signed else imported, quantizable_layers(qdq))
        assert len(report.integer) == 3 and report.float_left == []
        scripts.append(mod.script())
        outputs.append(run_on_cpu(mod, calib))
    assert '"int16"' in scripts[0] and '"uint8"' in scripts[0]  # the shifts, before
    assert '"int16"' not in scripts[1] and '"uint8"' not in scripts[1]
    assert np.array_equal(outputs[0], outputs[1])
