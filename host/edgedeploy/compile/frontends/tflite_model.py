"""TFLite models: read the flatbuffer, derive the input specs, import through TVM's Relax TFLite frontend.

The frontend (`tvm.relax.frontend.tflite.from_tflite`, in the apache-tvm wheel) needs the `tflite` package
(the flatbuffer schema; `pip install 'edgedeploy[tflite]'`). A quantized (QAT) model comes in as
dequantize -> float op -> quantize with the model's own scales and zero points; the `tflite-integer` stage
(tflite_integer.py) then computes its convolutions in integer arithmetic. Unsupported operators are found
before the import and reported as one line naming the operator and its node (the first output tensor).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import TensorSpec

from ...errors import ModelError
from ..stage import BuildContext, stage
from .model import ForeignModel, guess_layout, import_failure, output_specs

# tflite.TensorType -> numpy dtype name (the types an image classifier's input or output can have)
_DTYPES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 9: "int8", 7: "int16"}
_HINT = "see docs/troubleshooting.md#models"


def _parse(path: Path, data: bytes) -> Any:
    try:
        import tflite
    except ImportError:
        raise ModelError(
            f"{path}: reading TFLite models needs the tflite package",
            hint="pip install 'edgedeploy[tflite]'",
        ) from None
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise ModelError(f"{path} is not a TFLite model (no TFL3 flatbuffer identifier)", hint=_HINT)
    try:
        model = tflite.Model.GetRootAsModel(data, 0)
        if model.SubgraphsLength() < 1:
            raise ModelError(f"{path}: the TFLite model has no subgraph", hint=_HINT)
    except ModelError:
        raise
    except Exception as e:  # flatbuffers raises struct/index errors on a damaged file
        raise ModelError(f"{path} is not a readable TFLite model: {type(e).__name__}: {e}", hint=_HINT) from None
    return model


def _name(subgraph: Any, index: int) -> str:
    return str(subgraph.Tensors(index).Name().decode("utf-8"))


def load_tflite(path: Path, batch: int = 1) -> ForeignModel:
    """Read a .tflite file, check that every operator has a converter, and derive its input specs."""
    data = path.read_bytes()
    model = _parse(path, data)
    subgraph = model.Subgraphs(0)
    check_operators(path, model)
    inputs = []
    for i in range(subgraph.InputsLength()):
        index = subgraph.Inputs(i)
        tensor = subgraph.Tensors(index)
        name = _name(subgraph, index)
        dtype = _DTYPES.get(tensor.Type())
        if dtype is None:
            raise ModelError(f"{path}: input {name} has unsupported TFLite tensor type {tensor.Type()}", hint=_HINT)
        signature = tensor.ShapeSignatureAsNumpy() if tensor.ShapeSignatureLength() else tensor.ShapeAsNumpy()
        shape: list[int] = []
        for d, dim in enumerate(int(x) for x in signature):
            if dim > 0:
                shape.append(dim)
            elif d == 0:
                shape.append(batch)
            else:
                raise ModelError(f"{path}: input {name} has a dynamic dimension {d}", hint=_HINT)
        if shape and shape[0] != batch and signature[0] > 0 and batch != 1:
            raise ModelError(f"{path}: input {name} has a fixed batch of {shape[0]}, not {batch}", hint=_HINT)
        inputs.append(TensorSpec(name=name, shape=shape, dtype=dtype, layout=guess_layout(shape)))
    if not inputs:
        raise ModelError(f"{path}: the model has no inputs", hint=_HINT)
    quantized = any(_is_quantized(subgraph.Tensors(i)) for i in range(subgraph.TensorsLength()))
    sha = hashlib.sha256(data).hexdigest()
    return ForeignModel(path=path, sha256=sha, inputs=inputs, frontend="tflite", quantized=quantized)


def _is_quantized(tensor: Any) -> bool:
    """An 8-bit tensor with a scale: the model is pre-quantized (QAT or post-training full integer)."""
    q = tensor.Quantization()
    return tensor.Type() in (3, 9) and q is not None and q.ScaleLength() > 0


def _converter(model: Any) -> Any:
    from tvm import relax
    from tvm.relax.frontend.tflite.tflite_frontend import ExprTable, OperatorConverter

    return OperatorConverter(model, model.Subgraphs(0), ExprTable(), relax.BlockBuilder())


def check_operators(path: Path, model: Any) -> None:
    """One line for the first operator TVM's frontend cannot convert: its type, index and node (the name of
    its first output tensor), and the other unsupported types if there are more."""
    conv = _converter(model)
    subgraph = model.Subgraphs(0)
    bad: list[tuple[str, int, str, str]] = []  # (op type, index, node, why)
    for i in range(subgraph.OperatorsLength()):
        op = subgraph.Operators(i)
        try:
            kind = str(conv.get_op_code_str(op))
        except Exception as e:  # custom operators without a known code raise
            kind = f"custom ({e})".splitlines()[0]
        node = _name(subgraph, op.Outputs(0)) if op.OutputsLength() else f"operator {i}"
        if kind not in conv.convert_map:
            bad.append((kind, i, node, "is not supported by TVM's TFLite frontend"))
            continue
        quantized = any(t.qnn_params is not None for t in [*conv.get_input_tensors(op), *conv.get_output_tensors(op)])
        if quantized and kind not in conv._SUPPORTED_QUANTIZED_OPS:
            bad.append((kind, i, node, "has no quantized (uint8/int8) converter in TVM's TFLite frontend"))
    if bad:
        kind, i, node, why = bad[0]
        others = sorted({b[0] for b in bad[1:]} - {kind})
        more = f" (also unsupported: {', '.join(others)})" if others else ""
        raise ModelError(f"{path}: operator {kind} (#{i}, node {node!r}) {why}{more}", hint=_HINT)


@stage("import-tflite")
def import_tflite(ctx: BuildContext) -> None:
    """Relax from the TFLite flatbuffer (TVM's frontend), with the inputs' static shapes and types."""
    from tvm.relax.frontend.tflite import from_tflite

    path = ctx.model.path
    model = _parse(path, path.read_bytes())
    shapes = {s.name: tuple(s.shape) for s in ctx.model.inputs}
    dtypes = {s.name: s.dtype for s in ctx.model.inputs}
    try:
        ctx.ir = from_tflite(model, shape_dict=shapes, dtype_dict=dtypes)
    except Exception as e:  # the frontend raises many types; name the model and the last line
        raise ModelError(f"{path}: TVM cannot import this TFLite model: {import_failure(e)}", hint=_HINT) from None
    subgraph = model.Subgraphs(0)
    names = [_name(subgraph, subgraph.Outputs(i)) for i in range(subgraph.OutputsLength())]
    ctx.outputs = output_specs(ctx.ir, names)
