"""Read an ONNX model and derive its input specs; every failure names the file."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from edgedeploy_agent.bundle import Preprocess, TensorSpec
from edgedeploy_agent.preprocess import input_hw

from ..errors import InputError, ModelError

if TYPE_CHECKING:
    from .frontends import ForeignModel

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16", 11: "float64"}


@dataclass(frozen=True)
class OnnxModel:
    path: Path
    proto: onnx.ModelProto
    sha256: str
    inputs: list[TensorSpec]


def guess_layout(shape: list[int]) -> str | None:
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3) and shape[3] not in (1, 3):
        return "NCHW"
    if shape[3] in (1, 3):
        return "NHWC"
    return "NCHW"


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
