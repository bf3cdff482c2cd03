"""Models from TFLite and PyTorch: real TVM builds through TVM's own frontends, compared with the source's
runtime (TFLite's reference-kernel interpreter, PyTorch) on real images and inputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.compile.frontends.tflite_integer import multiply_by_quantized_multiplier, quantize_multiplier
from tests.helpers import Cli, assert_one_line_error, keep_user_files_out
from tests.host.frontends import TFLITE, needs_litert, needs_tflite, needs_torch, require_frontend

QAT = "mobilenet_v1_0.25_224_quant.tflite"


def test_quantize_multiplier_matches_tflite() -> None:
    # values TFLite's QuantizeMultiplier gives (Q31 significand, exponent)
    assert quantize_multiplier(0.5) == (1 << 30, 0)
    assert quantize_multiplier(1.0) == (1 << 30, 1)
    assert quantize_multiplier(0.75) == (3 << 29, 0)
    assert quantize_multiplier(0.0) == (0, 0)
    q, shift = quantize_multiplier(0.0009765625 * 3)  # 3 * 2**-10 = 0.75 * 2**-8
    assert (q, shift) == (3 << 29, -8)


def test_fixed_point_requantize_rounds_like_tflite() -> None:
    """x * 2**-k with TFLite's rounding, in int64 without float: half away from zero, and TFLite's double
    rounding (5 * 0.25: the doubling high multiply rounds 2.5 up to 3, the shift rounds 1.5 up to 2)."""
    q, shift = quantize_multiplier(0.25)
    x = np.array([-6, -5, -3, -2, 2, 3, 5, 6, 1 << 20], np.int64)
    got = multiply_by_quantized_multiplier(x, np.array([q]), np.array([shift]))
    assert got.tolist() == [-2, -1, -1, -1, 1, 1, 2, 2, 1 << 18]


def _relax_requantize(x: np.ndarray, m: float) -> np.ndarray:
    """The stage's Relax ops for the same arithmetic, compiled and run."""
    import tvm
    from tvm import relax

    from edgedeploy.compile.frontends.tflite_integer import _mbqm

    q, shift = quantize_multiplier(m)
    bb = relax.BlockBuilder()
    v = relax.Var("x", relax.TensorType(x.shape, "int32"))
    with bb.function("main", [v]):
        with bb.dataflow():
            out = bb.emit_output(_mbqm(bb, v, np.array([q], np.int64), np.array([shift], np.int64)))
        bb.emit_func_output(out)
    ex = tvm.compile(bb.get(), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return np.asarray(vm["main"](tvm.runtime.tensor(x)).numpy())


@pytest.mark.compile
@pytest.mark.parametrize("m", [0.25, 0.0037, 1.7])
def test_relax_requantize_equals_the_int64_reference(m: float) -> None:
    x = np.random.default_rng(1).integers(-(1 << 20), 1 << 20, (4, 257)).astype(np.int32)
    x[0, :8] = [-6, -5, -3, -2, 2, 3, 5, 6]
    q, shift = quantize_multiplier(m)
    want = multiply_by_quantized_multiplier(x, np.array([q]), np.array([shift]))
    np.testing.assert_array_equal(_relax_requantize(x, m), want)
    np.testing.assert_allclose(want, np.round(x * m), atol=1)  # and it is x * m, rounded


@pytest.fixture(scope="module")
def qat_bundle(data_dir: Path, tmp_path_factory: pytest.TempPathFactory, build_cache: Path) -> Path:
    """`edgedeploy build` of the QAT model, once for the module's tests (the source model goes to the session's
    build store, where `eval` finds it)."""
    require_frontend(*TFLITE)
    out = tmp_path_factory.mktemp("qat") / "q.edb"
    with pytest.MonkeyPatch.context() as mp:  # a config and state of the module's own
        keep_user_files_out(mp, tmp_path_factory.mktemp("qat-host"), build_cache)
        r = Cli()("build", str(data_dir / "models" / QAT), "-p", "cpu-x86_64", "-o", str(out), "--json", timeout=900)
    assert r.code == 0, r.err
    return out


@pytest.mark.compile
@needs_tflite
def test_qat_tflite_builds_in_integer_arithmetic(qat_bundle: Path, cli: Cli) -> None:
    r = cli("inspect", str(qat_bundle), "--json")
    m = json.loads(r.out)
    assert m["model"]["name"] == "mobilenet_v1_025_quant"  # the shipped card, found by the model's sha256
    assert m["schema_version"] == 3
    assert [(h["role"], h["name"]) for h in m["host_files"]] == [("tflite-model", QAT)]
    assert (m["inputs"][0]["shape"], m["inputs"][0]["dtype"], m["inputs"][0]["layout"]) == (
        [1, 224, 224, 3],
        "uint8",
        "NHWC",
    )
    assert (m["outputs"][0]["shape"], m["outputs"][0]["dtype"]) == ([1, 1001], "uint8")
    q = m["quantization"]
    assert q["precision"] == "int8" and q["float_in_runtime"] == []  # all 28 convolutions rewritten
    assert "tflite-integer" in m["provenance"]["options"]["pipeline"]


@pytest.mark.compile
@needs_tflite
@needs_litert
def test_qat_bundle_agrees_with_the_tflite_interpreter(data_dir: Path, qat_bundle: Path, cli: Cli) -> None:
    """The TVM library against TFLite's reference kernels on 60 real photos: the same top-1 everywhere and
    the same output bytes on nearly all (measured on all 500: 496 identical, the rest 1 step apart in the
    softmax, which TVM computes in float). Fake quant as the frontend emits it (no tflite-integer stage) gave
    93 of 100 top-1 agreement, 8 of 100 identical and differences of up to 16 steps."""
    r = cli("eval", str(qat_bundle), "--data", str(data_dir / "imagenet-sample"), "--limit", "60", "--json")
    assert r.code == 0, r.err
    e = json.loads(r.out)
    assert e["reference"] == "tflite_interpreter" and e["images"] == 60
    assert e["top1_agreement_bundle_vs_reference"] == 100.0
    assert e["outputs_identical_images"] >= 57 and e["max_abs_output_difference"] <= 1
    assert e["tvm_bundle"]["top1"] == e["tflite_interpreter"]["top1"] > 30


def _patched_operator(model: Path, out: Path, op_name: str, new_code: int) -> Path:
    """A copy of the model whose operator code `op_name` is replaced by `new_code` (in place in the flatbuffer)."""
    import tflite
    from tflite.BuiltinOperator import BuiltinOperator

    data = bytearray(model.read_bytes())
    m = tflite.Model.GetRootAsModel(data, 0)
    want = getattr(BuiltinOperator, op_name)
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        if max(oc.DeprecatedBuiltinCode(), oc.BuiltinCode()) != want:
            continue
        for slot, fmt in ((4, "<b"), (10, "<i")):  # deprecated_builtin_code (int8), builtin_code (int32)
            o = oc._tab.Offset(slot)
            if o:
                import struct

                struct.pack_into(fmt, data, oc._tab.Pos + o, new_code)
    out.write_bytes(bytes(data))
    return out


@needs_tflite
def test_unsupported_tflite_operator_is_one_line_naming_op_and_node(data_dir: Path, tmp_path: Path, cli: Cli) -> None:
    from tflite.BuiltinOperator import BuiltinOperator

    # LSH_PROJECTION has no converter in TVM's TFLite frontend
    bad = _patched_operator(
        data_dir / "models" / QAT, tmp_path / "bad.tflite", "AVERAGE_POOL_2D", BuiltinOperator.LSH_PROJECTION
    )
    r = cli("build", str(bad), "-p", "cpu-x86_64", "-o", str(tmp_path / "b.edb"))
    assert_one_line_error(r, code=2, contains="operator LSH_PROJECTION")
    assert "MobilenetV1/Logits/AvgPool_1a/AvgPool" in r.err and "troubleshooting.md" in r.err


@needs_tflite
def test_bad_model_files_are_one_line(data_dir: Path, tmp_path: Path, cli: Cli) -> None:
    junk = tmp_path / "junk.tflite"
    junk.write_bytes(b"\x00" * 64)
    assert_one_line_error(cli("build", str(junk), "-p", "cpu-x86_64"), code=2, contains="is not a TFLite model")
    other = tmp_path / "model.pb"
    other.write_bytes(b"x")
    assert_one_line_error(cli("build", str(other), "-p", "cpu-x86_64"), code=2, contains="unknown model type '.pb'")
    # a QAT model keeps its own scales: calibration is for ONNX models
    r = cli("build", str(data_dir / "models" / QAT), "-p", "cpu-x86_64", "--int8", "--calibration", str(tmp_path))
    assert_one_line_error(r, contains="needs an ONNX model")


@pytest.mark.compile
@needs_torch
def test_pytorch_exported_program_builds_and_runs_like_pytorch(tmp_path: Path, cli: Cli) -> None:
    import torch

    from edgedeploy_agent.bundle import extract_bundle
    from edgedeploy_agent.runtime import load_runtime

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU6(),
        torch.nn.Conv2d(8, 8, 3, padding=1, groups=8),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 5),
    ).eval()
    example = torch.rand(1, 3, 32, 32)
    torch.export.save(torch.export.export(net, (example,)), tmp_path / "net.pt2")
    r = cli("build", str(tmp_path / "net.pt2"), "-p", "cpu-x86_64", "-o", str(tmp_path / "net.edb"),
            "--color", "rgb", "--mean", "0", "--std", "255", timeout=600)  # fmt: skip
    assert r.code == 0, r.err
    m = extract_bundle(tmp_path / "net.edb", tmp_path / "rel")
    assert [(h.role, h.name) for h in m.host_files] == [("torch-program", "net.pt2")] and m.schema_version == 3
    assert (m.inputs[0].shape, m.inputs[0].layout, m.outputs[0].shape) == ([1, 3, 32, 32], "NCHW", [1, 5])
    x = torch.rand(1, 3, 32, 32)
    want = net(x).detach().numpy()
    got = load_runtime(tmp_path / "rel", m).run([x.numpy()])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # `tune` reads the program back from the build store (a file without suffix) and tunes under the key the
    # build applies (fp32)
    r = cli("tune", str(tmp_path / "net.edb"), "--trials", "2", "--tasks", "1", "--cost-model", "random", "--json",
            timeout=600)  # fmt: skip
    assert r.code == 0, r.err
    tuned = json.loads(r.out)
    assert tuned["key"] == f"{m.model.source_sha256[:16]}-fp32" and tuned["kernels"] > 0


@needs_torch
def test_unsupported_pytorch_operator_is_one_line(tmp_path: Path, cli: Cli) -> None:
    import torch

    class Odd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.linalg.inv(x)  # no converter in TVM 0.27's exported-program importer

    torch.export.save(torch.export.export(Odd(), (torch.rand(1, 3, 3),)), tmp_path / "odd.pt2")
    r = cli("build", str(tmp_path / "odd.pt2"), "-p", "cpu-x86_64")
    assert_one_line_error(r, code=2, contains="is not supported by TVM's PyTorch frontend")
    assert "node '" in r.err
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    assert_one_line_error(cli("build", str(junk), "-p", "cpu-x86_64"), code=2, contains="not a readable torch.export")
