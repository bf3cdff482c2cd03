"""Read an ONNX model and derive its input specs; every failure names the file."""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import onnx

from edgedeploy_agent.bundle import Preprocess, TensorSpec
from edgedeploy_agent.preprocess import input_hw

from ...errors import InputError, ModelError
from .model import ForeignModel, guess_layout

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16", 11: "float64"}


@dataclass(frozen=True)
class OnnxModel:
    path: Path
    proto: onnx.ModelProto
    sha256: str
    inputs: list[TensorSpec]

    @functools.cached_property
    def graph_sha256(self) -> str:
        """The model without its weights (graph_digest): names the tuning databases its kernels share."""
        return graph_digest(self.proto)


# integer tensors up to this many elements keep their values in graph_digest: shapes, axes, pads, indices
_SHAPE_LIKE = 64


def graph_digest(proto: onnx.ModelProto) -> str:
    """sha256 of what decides a model's kernels: operators, attributes, connections, tensor shapes and
    types, shape-like integer constants. Not the weights, nor names of nodes, doc strings or the producer.

    A retrained model, or the same export on another CPU (its weights differ in the last bits: three build
    hosts wrote three ResNet-18 files, docs/tuning.md), has the same kernels, so the same tuning database.
    Two graphs that differ only in what this leaves out compile to the same kernels; where a database's
    records do not fit a graph's kernels, MetaSchedule and the GEMM configurations match kernels by their
    structure and skip them, so a collision costs at most the tuning, never correctness."""

    def tensor(t: onnx.TensorProto) -> onnx.TensorProto:
        small_int = t.data_type in _INT_TYPES and math.prod(t.dims) <= _SHAPE_LIKE
        if small_int:
            return onnx.TensorProto(name=t.name, dims=t.dims, data_type=t.data_type, raw_data=_int_bytes(t))
        return onnx.TensorProto(name=t.name, dims=t.dims, data_type=t.data_type)

    def node(n: onnx.NodeProto) -> onnx.NodeProto:
        out = onnx.NodeProto(op_type=n.op_type, domain=n.domain, input=n.input, output=n.output)
        for a in n.attribute:
            b = onnx.AttributeProto()
            b.CopyFrom(a)
            b.ClearField("doc_string")
            if a.HasField("t"):
                b.t.CopyFrom(tensor(a.t))
            if a.HasField("g"):
                b.g.CopyFrom(graph(a.g))
            for i, t in enumerate(a.tensors):
                b.tensors[i].CopyFrom(tensor(t))
            for i, sub in enumerate(a.graphs):
                b.graphs[i].CopyFrom(graph(sub))
            out.attribute.append(b)
        return out

    def graph(g: onnx.GraphProto) -> onnx.GraphProto:
        return onnx.GraphProto(
            node=[node(n) for n in g.node],
            initializer=[tensor(t) for t in g.initializer],
            sparse_initializer=[
                onnx.SparseTensorProto(dims=t.dims, values=tensor(t.values), indices=tensor(t.indices))
                for t in g.sparse_initializer
            ],
            input=g.input,
            output=g.output,
        )

    stripped = onnx.ModelProto(ir_version=proto.ir_version, opset_import=proto.opset_import, graph=graph(proto.graph))
    return hashlib.sha256(stripped.SerializeToString(deterministic=True)).hexdigest()


_INT_TYPES = {onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
              onnx.TensorProto.UINT8, onnx.TensorProto.BOOL}  # fmt: skip


def _int_bytes(t: onnx.TensorProto) -> bytes:
    """An integer tensor's values as bytes, however the file stores them (raw_data or the typed fields)."""
    from onnx import numpy_helper

    return bytes(numpy_helper.to_array(t).astype("<i8").tobytes())


def load_onnx(path: Path, batch: int = 1) -> OnnxModel:
    """Load and check a model; dynamic batch dimensions are fixed to `batch`."""
    if not path.is_file():
        raise ModelError(f"model file {path} does not exist")
    data = path.read_bytes()
    try:
        proto = onnx.load_from_string(data)
        onnx.checker.check_model(proto)
    except Exception as e:  # onnx raises DecodeError, ValidationError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{path} is not a valid ONNX model: {first}") from None
    initializers = {i.name for i in proto.graph.initializer}
    inputs = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        tt = value.type.tensor_type
        dtype = _ONNX_DTYPES.get(tt.elem_type)
        if dtype is None:
            raise ModelError(f"{path}: input {value.name} has unsupported element type {tt.elem_type}")
        shape: list[int] = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            elif i == 0:
                shape.append(batch)
            else:
                raise ModelError(f"{path}: input {value.name} has a dynamic dimension {i} ({d.dim_param or '?'})")
        inputs.append(TensorSpec(name=value.name, shape=shape, dtype=dtype, layout=guess_layout(shape)))
    if not inputs:
        raise ModelError(f"{path}: the model has no inputs")
    return OnnxModel(path=path, proto=proto, sha256=hashlib.sha256(data).hexdigest(), inputs=inputs)


COLOR_CHANNELS = {"gray": 1, "rgb": 3, "bgr": 3}


def implied_color(model: OnnxModel | ForeignModel, pp: Preprocess) -> Preprocess:
    """`pp`, gray where nobody set a colour (neither card nor option) and the image input has one channel:
    the default, rgb, gives three, and the error would blame a colour nobody chose (issue 35)."""
    spec = model.inputs[0]
    if "color" in pp.model_fields_set or len(spec.shape) != 4 or spec.layout is None or input_hw(spec)[2] != 1:
        return pp
    return pp.model_copy(update={"color": "gray"})


def check_preprocess(model: OnnxModel | ForeignModel, pp: Preprocess) -> None:
    """Refuse, before anything is compiled or written, preprocessing that cannot feed the model's image
    input (the device would only find out in its health check): channels, colour, finite non-zero numbers."""
    hint = "set them with --color, --scale, --mean, --std or in the model card's preprocess table"
    if not all(math.isfinite(v) for v in [pp.scale, *pp.mean, *pp.std]):
        raise InputError("preprocess scale, mean and std must be finite numbers", hint=hint)
    if pp.scale == 0 or 0 in pp.std:
        raise InputError("preprocess scale and std must not be 0 (they scale every pixel)", hint=hint)
    spec = model.inputs[0]
    if len(spec.shape) != 4 or spec.layout is None:
        return  # not an image tensor: there are no channels to match
    channels = input_hw(spec)[2]
    where = f"input {spec.name} of {model.path.name} has {_channels(channels)}"
    if COLOR_CHANNELS[pp.color] != channels:
        raise InputError(
            f"preprocess color {pp.color} gives {_channels(COLOR_CHANNELS[pp.color])}, but {where}", hint=hint
        )
    for what, values in (("mean", pp.mean), ("std", pp.std)):
        if len(values) not in (1, channels):
            raise InputError(
                f"preprocess {what} has {len(values)} values, but {where}",
                hint=f"give one value for every channel or {channels}; {hint}",
            )


def _channels(n: int) -> str:
    return f"{n} channel" + ("s" if n != 1 else "")
