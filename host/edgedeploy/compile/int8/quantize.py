"""Static INT8 quantization to one QDQ ONNX model with onnxruntime.quantization.

`quantize_qdq(model, inputs, options)` is the API: calibration inputs are already preprocessed arrays
(see edgedeploy.compile.int8.datasets.load_calibration). `tensorrt_qdq` is the TensorRT-compatible preset (symmetric
activations, zero points 0, per-channel symmetric weights) callable on its own.
"""

from __future__ import annotations

import fnmatch
import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import InputError, ModelError
from .equalize import correct_bias, cross_layer_equalize
from .graph_prep import prepare_float_model
from .refine import center_relu6, pad_in_quantized_domain, refine_qdq

Method = Literal["minmax", "entropy", "percentile"]
QUANTIZABLE = ("Conv", "Gemm", "MatMul", "ConvTranspose")
# Presets for --keep-float: names resolved against the model's quantizable layers.
PRESETS = ("first", "last", "first-last")


@dataclass(frozen=True)
class QuantizeOptions:
    method: Method = "minmax"
    percentile: float = 99.999
    per_channel: bool = True
    symmetric_activations: bool = False
    samples: int = 128
    keep_float: tuple[str, ...] = ()  # node names, fnmatch patterns or presets (first, last, first-last)
    power_of_two: bool = False
    equalize: bool = False  # cross-layer equalization before calibration (measured: no gain on MobileNetV1)
    bias_correction: bool = True
    # layer-wise refinement (refine.py): centred ReLU6, MSE clipping, learned rounding, empirical bias
    # correction. None: on for symmetric activations (TensorRT kind), off for the asymmetric kind.
    refine: bool | None = None

    @property
    def refines(self) -> bool:
        return self.symmetric_activations if self.refine is None else self.refine


@dataclass
class QuantizeReport:
    model: onnx.ModelProto
    float_layers: list[str]
    equalized_pairs: int
    samples: int
    options: QuantizeOptions
    quantized_layers: list[str] = field(default_factory=list)
    choices: list[str] = field(default_factory=list)  # per layer, what the refinement chose
    seconds: float = 0.0  # calibration wall time (quantization and refinement)


def quantizable_layers(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes that static INT8 quantization turns into integer layers, in graph order."""
    return [n.name for n in model.graph.node if n.op_type in QUANTIZABLE]


def resolve_keep_float(model: onnx.ModelProto, specs: tuple[str, ...]) -> list[str]:
    """Expand presets and patterns into node names; a spec matching nothing is an error."""
    layers = quantizable_layers(model)
    out: list[str] = []
    for spec in specs:
        if spec in ("first", "first-last"):
            out.append(layers[0])
        if spec in ("last", "first-last"):
            out.append(layers[-1])
        if spec in PRESETS:
            continue
        hits = [n for n in layers if n == spec or fnmatch.fnmatchcase(n, spec)]
        if not hits:
            raise InputError(
                f"--keep-float {spec!r} matches no quantizable layer",
                hint=f"presets: {', '.join(PRESETS)}; layers: {', '.join(layers[:4])}, ...",
            )
        out.extend(hits)
    return list(dict.fromkeys(out))


def name_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Give every unnamed node a stable name (its first output), so layers can be named."""
    for n in model.graph.node:
        if not n.name:
            n.name = f"{n.op_type}:{n.output[0]}"
    return model


class _Reader:
    """onnxruntime CalibrationDataReader over an in-memory batch, one sample at a time."""

    def __init__(self, input_name: str, inputs: np.ndarray) -> None:
        self._name, self._inputs = input_name, inputs
        self._it: Iterator[dict[str, np.ndarray]] = self._gen()

    def _gen(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(len(self._inputs)):
            yield {self._name: self._inputs[i : i + 1]}

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:
        self._it = self._gen()


def _ort_quantize(
    model: onnx.ModelProto, inputs: np.ndarray, opts: QuantizeOptions, exclude: list[str]
) -> onnx.ModelProto:
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    ort.set_default_logger_severity(3)  # calibration sessions otherwise log every unused initializer
    methods = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }
    extra = {
        "ActivationSymmetric": opts.symmetric_activations,
        "WeightSymmetric": True,
        "CalibPercentile": opts.percentile,
        # power-of-two scales are applied afterwards; an int32 bias would then need its scale recomputed
        "QuantizeBias": not opts.power_of_two,
    }
    with tempfile.TemporaryDirectory(prefix="edgedeploy-quant-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        onnx.save(model, src)
        try:
            with _quiet_root_logger():
                quantize_static(
                    str(src),
                    str(dst),
                    _Reader(model.graph.input[0].name, inputs),
                    quant_format=QuantFormat.QDQ,
                    per_channel=opts.per_channel,
                    activation_type=QuantType.QInt8 if opts.symmetric_activations else QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    nodes_to_exclude=exclude,
                    calibrate_method=methods[opts.method],
                    extra_options=extra,
                )
        except Exception as e:  # onnxruntime raises Fail/InvalidGraph/ValueError..., naming the node
            lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
            raise ModelError(
                f"onnxruntime cannot quantize model {model.graph.name or '(unnamed)'}: "
                f"{lines[-1] if lines else type(e).__name__}",
                hint="keep the named node in float with --keep-float NODE, or build without --int8",
            ) from None
        return onnx.load(dst)


@contextmanager
def _quiet_root_logger() -> Iterator[None]:
    """onnxruntime.quantization logs advice ("consider pre-processing") on the root logger: not for users."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def run_tensors(model: onnx.ModelProto, inputs: np.ndarray, names: list[str]) -> list[np.ndarray]:
    """Run `model` on `inputs` with onnxruntime and return the named intermediate tensors."""
    import onnxruntime as ort

    m = onnx.ModelProto.FromString(model.SerializeToString())
    outputs = {o.name: o for o in m.graph.output}
    del m.graph.output[:]
    m.graph.output.extend(outputs.get(n, onnx.ValueInfoProto(name=n)) for n in dict.fromkeys(names))
    _prune(m.graph)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the named tensors
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed_name = m.graph.input[0].name
    outs: list[list[np.ndarray]] = [[] for _ in names]
    for i in range(0, len(inputs), 16):
        res = sess.run(names, {feed_name: inputs[i : i + 16]})
        for k, r in enumerate(res):
            outs[k].append(r)
    return [np.concatenate(o) for o in outs]


def _prune(g: onnx.GraphProto) -> None:
    """Keep only the nodes and initializers the graph's outputs depend on (the refinement asks for early
    layers of the whole model); a graph with subgraphs (If, Loop) is left whole."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in g.node for a in n.attribute):
        return
    needed, keep = {o.name for o in g.output}, []
    for node in reversed(g.node):
        if needed.intersection(node.output):
            keep.append(node)
            needed.update(node.input)
    del g.node[:]
    g.node.extend(reversed(keep))
    needed.update(i.name for i in g.input)  # an initializer listed as an input (IR < 4) stays
    for t in [t for t in g.initializer if t.name not in needed]:
        g.initializer.remove(t)


def quantize_qdq(
    model: onnx.ModelProto,
    inputs: np.ndarray,
    options: QuantizeOptions,
    progress: Callable[[str], None] = lambda s: None,
) -> QuantizeReport:
    """Calibrate on `inputs` and return the QDQ model (equalized, bias-corrected, refined when asked)."""
    start = time.perf_counter()
    model = name_nodes(prepare_float_model(model))
    layers = quantizable_layers(model)
    if not layers:
        raise ModelError(
            f"model {model.graph.name or '(unnamed)'} has no quantizable layers ({', '.join(QUANTIZABLE)})",
            hint="INT8 pays off for convolution and matrix-multiply models; build it without --int8",
        )
    if len(inputs) == 0:
        raise InputError("the calibration source gave no samples")
    inputs = inputs[: options.samples]
    exclude = resolve_keep_float(model, options.keep_float)
    tail = _tail_nodes(model)
    pairs = 0
    if options.equalize:
        model, pairs = cross_layer_equalize(model)
    choices: list[str] = []
    pads: list[str] = []
    if options.refines and options.symmetric_activations:
        model, centred, pads = center_relu6(model)
        choices += [f"{name}: ReLU6 output centred on 0 (range -3..3, all 8 bits)" for name in centred]
    if options.bias_correction and not options.refines:  # the refinement corrects biases itself
        model = correct_bias(
            model, lambda m, names: run_tensors(m, inputs, names), frozenset(exclude), options.per_channel
        )
    qdq = _ort_quantize(model, inputs, options, exclude + tail + pads)
    pad_in_quantized_domain(qdq, pads)
    if options.refines:
        # MSE clipping replaces minmax ranges only: an entropy or percentile range is the user's choice
        clip = options.symmetric_activations and options.method == "minmax"
        refined = refine_qdq(model, qdq, inputs, run_tensors, clip=clip, progress=progress)
        choices += [c.line() for c in refined]
    if options.power_of_two:
        round_scales_to_power_of_two(qdq)
    quantized = [n for n in layers if n not in exclude]
    secs = time.perf_counter() - start
    return QuantizeReport(qdq, exclude, pairs, len(inputs), options, quantized, choices, secs)


def _tail_nodes(model: onnx.ModelProto) -> list[str]:
    """Nodes after the last conv/matmul (Flatten, Softmax, ...): they stay float, so the logits are never
    requantized to 8 bits (that creates top-1 ties and costs accuracy for nothing)."""
    nodes = list(model.graph.node)
    last = max(i for i, n in enumerate(nodes) if n.op_type in QUANTIZABLE)
    return [n.name for n in nodes[last + 1 :]]


def tensorrt_qdq(model: onnx.ModelProto, inputs: np.ndarray, options: QuantizeOptions | None = None) -> QuantizeReport:
    """The QDQ model TensorRT can build from: symmetric INT8 activations and weights, zero points 0. Refined
    only when asked (`--refine`): the device's engine acceptance (tensorrt_artifacts._acceptance_atol, the FP32
    model's distance from the reference) was measured on unrefined models, and a refined MobileNetV1-0.25 comes
    within 0.048 of its reference on 16 samples, under the 0.065 a correct engine was measured to stray. Until
    engines of refined models are measured on a GPU, the default stays the measured one."""
    base = options or QuantizeOptions()
    refine = False if base.refine is None else base.refine
    opts = replace(base, symmetric_activations=True, per_channel=True, refine=refine)
    return quantize_qdq(model, inputs, opts)


def round_scales_to_power_of_two(qdq: onnx.ModelProto) -> None:
    """Round every int8 Q/DQ scale up to a power of two (keeps the range; shifts instead of multiplies)."""
    inits = {t.name: t for t in qdq.graph.initializer}
    done: set[str] = set()
    for n in qdq.graph.node:
        if n.op_type not in ("QuantizeLinear", "DequantizeLinear") or len(n.input) < 2:
            continue
        name = n.input[1]
        if name in done or name not in inits:
            continue
        zp = inits.get(n.input[2]) if len(n.input) > 2 else None
        if zp is not None and zp.data_type == onnx.TensorProto.INT32:
            continue  # an int32 bias keeps its own scale (biases stay float with power-of-two scales)
        s = numpy_helper.to_array(inits[name]).astype(np.float32)
        p2 = np.exp2(np.ceil(np.log2(np.maximum(s, 1e-30)))).astype(np.float32)
        if n.op_type == "DequantizeLinear" and n.input[0] in inits:
            # a stored weight: requantize it against the new scale so its float value barely moves
            w = inits[n.input[0]]
            q = numpy_helper.to_array(w).astype(np.float32)
            axis = next((int(a.i) for a in n.attribute if a.name == "axis"), 1)
            shape = [1] * q.ndim
            if s.ndim == 1 and s.size > 1:
                shape[axis] = -1
            q2 = np.clip(np.round(q * (s / p2).reshape(shape)), -127, 127).astype(numpy_helper.to_array(w).dtype)
            w.CopyFrom(numpy_helper.from_array(q2, w.name))
        inits[name].CopyFrom(numpy_helper.from_array(p2, name))
        done.add(name)
