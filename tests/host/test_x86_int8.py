"""Tensorized INT8 1x1 convolutions on x86 (compile/x86_int8.py): exact against numpy, and the same bytes as the
float32-exact graph when they replace its pointwise convolutions in a real MobileNet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from edgedeploy.compile.graph_prep import prepare_float_model
from edgedeploy.compile.int8_rewrite import rewrite_int8
from edgedeploy.compile.package import load_card
from edgedeploy.compile.quantize import QuantizeOptions, quantizable_layers, quantize_qdq
from edgedeploy.compile.tune_offline import scheduled_kernels, tunable_tasks
from edgedeploy.compile.x86_int8 import (
    AVX2,
    VNNI,
    DotKind,
    dot_kind,
    pack_activations_numpy,
    pack_weights,
    pointwise_kernel,
)
from edgedeploy.datasets import load_calibration
from edgedeploy.profiles import get_profile
from edgedeploy_agent.bundle import TensorSpec, cpu_flags

# the targets each kind is compiled for: the built-in x86-64-v3 profile's, and an AVX-512 VNNI target such as a
# user's profile would have
TARGETS = {
    AVX2: dict(get_profile("cpu-x86_64").compiler.target),
    VNNI: {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v4", "mattr": ["+avx512vnni"]},
}
MNV1_CARD = Path(__file__).resolve().parents[2] / "examples" / "cards" / "mobilenet_v1_0.25_224.toml"


def _runnable(kind: DotKind) -> None:
    if kind.cpu_flag not in (cpu_flags(Path("/proc/cpuinfo")) or ()):
        pytest.skip(f"this CPU has no {kind.cpu_flag}; the {kind.name} kernel cannot run here")


def test_profiles_choose_their_dot_product() -> None:
    v3 = get_profile("cpu-x86_64")
    assert dot_kind(v3) is AVX2
    features = [*v3.compiler.cpu_features, "avx512f", "avx512bw", "avx512vl", "avx512_vnni"]
    v4 = v3.model_copy(update={"compiler": v3.compiler.model_copy(update={"cpu_features": features})})
    assert dot_kind(v4) is VNNI
    assert dot_kind(get_profile("t4")) is None and dot_kind(get_profile("xavier-agx")) is None


def _reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, mult: np.ndarray, zy: int, dtype: str) -> np.ndarray:
    n, c, h, wd = x.shape
    acc = np.einsum("oc,ncp->nop", w.reshape(w.shape[0], c).astype(np.int64), x.reshape(n, c, -1).astype(np.int64))
    y = np.round((acc + bias[None, :, None]).astype(np.float32) * mult[None, :, None]) + zy
    lo, hi = (0, 255) if dtype == "uint8" else (-128, 127)
    return np.clip(y, lo, hi).astype(dtype)


@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
@pytest.mark.parametrize(
    "n,c,o,hw,out",
    [(1, 128, 128, 14, "uint8"), (2, 16, 24, 5, "int8"), (1, 256, 64, 1, "uint8"), (1, 8, 16, 57, "uint8")],
)
def test_pointwise_kernel_is_exact(kind: DotKind, n: int, c: int, o: int, hw: int, out: str) -> None:
    """Full-range uint8 activations and int8 weights, pixel counts that are not a multiple of the lanes, batch 2,
    both output types: the compiled kernel's bytes equal numpy's int64 arithmetic."""
    _runnable(kind)
    rng = np.random.default_rng(n * c + o + hw)
    x = rng.integers(0, 256, (n, c, hw, hw)).astype(np.uint8)
    w = rng.integers(-128, 128, (o, c, 1, 1)).astype(np.int8)
    bias = rng.integers(-5000, 5000, o).astype(np.int32)
    mult = (rng.random(o) * 2e-3).astype(np.float32)
    packed, p = pack_activations_numpy(x, kind), hw * hw
    kernel = pointwise_kernel(kind, n, c, o, hw, hw, 7, out).with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": kernel}), target=tvm.target.Target(TARGETS[kind]))
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(a, dev) for a in (packed, pack_weights(w, kind), bias, mult)]
    y = tvm.runtime.tensor(np.zeros((n, o, p), out), dev)
    lib(*args, y)
    assert np.array_equal(y.numpy(), _reference(x, w, bias, mult, 7, out))


@pytest.fixture(scope="module")
def mobilenet_qdq(data_dir: Path) -> tuple[onnx.ModelProto, np.ndarray]:
    model = prepare_float_model(onnx.load(data_dir / "models" / "mobilenet_v1_0.25_224.onnx"))  # as build does
    spec = TensorSpec(name=model.graph.input[0].name, shape=[1, 3, 224, 224], layout="NCHW")
    calib = load_calibration(data_dir / "imagenet-sample", load_card(MNV1_CARD).preprocess, spec, 8)
    return quantize_qdq(model, calib, QuantizeOptions(samples=8)).model, calib


@pytest.mark.parametrize("kind", [AVX2, VNNI], ids=lambda k: k.name)
def test_mobilenet_pointwise_layers_on_the_dot_product(
    mobilenet_qdq: tuple[onnx.ModelProto, np.ndarray], kind: DotKind
) -> None:
    """All 13 pointwise convolutions of MobileNetV1 become the tensorized kernel; the compiled model gives the
    same bytes as the float32-exact graph on real images; tuning skips those kernels and the manifest's
    'kernels from a database' does not count them."""
    _runnable(kind)
    qdq, images = mobilenet_qdq
    name = qdq.graph.input[0].name
    imported = relax.transform.DecomposeOpsForInference()(
        from_onnx(qdq, shape_dict={name: [1, 3, 224, 224]}, keep_params_in_input=False)
    )
    target = tvm.target.Target(TARGETS[kind])
    outputs = []
    for dot in (None, kind):
        mod, report = rewrite_int8(imported, quantizable_layers(qdq), float_exact=True, dot=dot)
        assert report.float_left == []
        kernels = [gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.startswith("int8_conv1x1")]
        calls = mod["main"].script().count("int8_conv1x1")
        assert (len(kernels) > 0, calls) == ((True, 13) if dot else (False, 0))
        with target:
            if dot:
                fused = relax.get_pipeline("zero")(mod)
                assert not any(t.task_name.startswith("int8_conv1x1") for t in tunable_tasks(fused, target))
                done, _ = scheduled_kernels(fused)
                assert not any(k.startswith("int8_conv1x1") for k in done)
            ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        outputs.append(np.concatenate([vm["main"](tvm.runtime.tensor(x[None])).numpy() for x in images[:4]]))
    assert np.array_equal(outputs[0], outputs[1])
