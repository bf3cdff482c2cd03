"""What a model file says about its own preprocessing, for a build (or `eval`) without a model card and for
`edgedeploy card init`: ONNX metadata_props, TFLite metadata, and what the input tensor leaves no choice about.

A model without a card used to build with the defaults (rgb, mean 0, std 1) without a word, and then scored
0 % (issue 35). Now the colour order and the normalisation must come from somewhere: the command line, a card,
the model file, or the input itself (one channel is gray, uint8 is raw pixels); else the build is refused with
the card fields to give.

Read from the model:

- ONNX `metadata_props`: `preprocess` (or `preprocessing`, `normalization`) naming a well-known preprocessing
  (`PREPROCESSING_NAMES`: imagenet/torchvision, tf/inception, caffe, raw, unit) or giving it as JSON
  (`{"color": "rgb", "mean": [...], "std": [...]}`); the Windows ML keys `Image.BitmapPixelFormat` and
  `Image.NominalPixelRange` (onnx/docs/MetadataProps.md).
- TFLite: the `TFLITE_METADATA` buffer (tflite-support's metadata_schema.fbs): the input's
  NormalizationOptions and colour space, and the output's label file (zipped onto the model).
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import Preprocess, TensorSpec

from ..errors import InputError
from ..paths import config_dir
from .cards import ModelCard, default_name

# well-known preprocessing names: (colour, mean, std) on 0..255 pixels
PREPROCESSING_NAMES: dict[str, tuple[str, list[float], list[float]]] = {
    "imagenet": ("rgb", [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]),  # torchvision, Keras "torch"
    "tf": ("rgb", [127.5], [127.5]),  # (x - 127.5) / 127.5 = [-1, 1]: TF-slim, Inception, MobileNet
    "caffe": ("bgr", [103.939, 116.779, 123.68], [1.0]),  # Keras "caffe": BGR, mean subtracted, no scaling
    "raw": ("rgb", [0.0], [1.0]),  # pixels 0..255 as they are
    "unit": ("rgb", [0.0], [255.0]),  # x / 255 = [0, 1]
}
_ALIASES = {"torch": "imagenet", "torchvision": "imagenet", "inception": "tf", "-1..1": "tf", "[-1,1]": "tf",
            "0..255": "raw", "[0,255]": "raw", "0..1": "unit", "[0,1]": "unit"}  # fmt: skip
_PREPROCESS_KEYS = ("edgedeploy.preprocess", "preprocess", "preprocessing", "normalization", "normalisation")
# Windows ML's image metadata (onnx/docs/MetadataProps.md)
_PIXEL_FORMATS = {"gray8": "gray", "rgb8": "rgb", "rgba8": "rgb", "bgr8": "bgr", "bgra8": "bgr"}
_PIXEL_RANGES = {"nominalrange_0_255": ([0.0], [1.0]), "normalized_0_1": ([0.0], [255.0]),
                 "normalized_1_1": ([127.5], [127.5])}  # fmt: skip
# what a build needs to know: the card fields and the options that give them
NEEDED = {
    "color": ("preprocess.color", "--color"),
    "normalization": ("preprocess.mean, preprocess.std", "--mean/--std"),
}


@dataclass
class ModelFacts:
    path: Path
    sha256: str
    inputs: list[TensorSpec]
    outputs: list[tuple[str, list[Any], str | None]]  # name, shape (a name for a dynamic dimension), last op
    preprocess: dict[str, Any] = field(default_factory=dict)  # what the file says: color, mean, std
    found_in: str | None = None  # where it says it
    labels: list[str] | None = None

    @property
    def channels(self) -> int | None:
        """The channels of the first input if it is an NCHW/NHWC image, else None."""
        spec = self.inputs[0]
        if len(spec.shape) != 4 or spec.layout not in ("NCHW", "NHWC"):
            return None
        return spec.shape[1] if spec.layout == "NCHW" else spec.shape[3]

    def implied(self) -> dict[str, Any]:
        """What the input leaves no choice about: one channel is gray, a uint8 input takes raw pixels."""
        out: dict[str, Any] = {}
        if self.channels == 1:
            out["color"] = "gray"
        if self.inputs[0].dtype == "uint8":
            out |= {"mean": [0.0], "std": [1.0]}
        return out


def read_facts(path: Path) -> ModelFacts:
    """Load the model (its frontend's errors: one line) and read what it says about itself."""
    from .frontends.load import frontend_of, load_model
    from .frontends.onnx_model import OnnxModel

    frontend = frontend_of(path)
    model = load_model(path)
    if isinstance(model, OnnxModel):
        facts = ModelFacts(path, model.sha256, model.inputs, _onnx_outputs(model.proto))
        _onnx_metadata(model.proto, facts)
    else:
        facts = ModelFacts(path, model.sha256, model.inputs, [])
        if frontend == "tflite":
            _tflite_metadata(path.read_bytes(), facts)
    return facts


def _onnx_outputs(proto: Any) -> list[tuple[str, list[Any], str | None]]:
    producers = {o: n.op_type for n in proto.graph.node for o in n.output}
    outs = []
    for value in proto.graph.output:
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in value.type.tensor_type.shape.dim
        ]
        outs.append((value.name, dims, producers.get(value.name)))
    return outs


def _onnx_metadata(proto: Any, facts: ModelFacts) -> None:
    props = {p.key.strip().lower(): p.value.strip() for p in proto.metadata_props}
    for key in _PREPROCESS_KEYS:
        if key in props:
            facts.preprocess = _described(props[key], f"ONNX metadata_props {key!r}")
            facts.found_in = f"the model's ONNX metadata ({key} = {props[key]!r})"
            return
    found: dict[str, Any] = {}
    fmt = props.get("image.bitmappixelformat", "").lower()
    if fmt in _PIXEL_FORMATS:
        found["color"] = _PIXEL_FORMATS[fmt]
    pixel_range = props.get("image.nominalpixelrange", "").lower()
    if pixel_range in _PIXEL_RANGES:
        found["mean"], found["std"] = _PIXEL_RANGES[pixel_range]
    if found:
        facts.preprocess = found
        facts.found_in = "the model's ONNX metadata (Image.BitmapPixelFormat, Image.NominalPixelRange)"


def _described(text: str, where: str) -> dict[str, Any]:
    """A preprocessing named (PREPROCESSING_NAMES) or given as JSON with Preprocess's fields."""
    name = _ALIASES.get(text.lower(), text.lower())
    if name in PREPROCESSING_NAMES:
        color, mean, std = PREPROCESSING_NAMES[name]
        return {"color": color, "mean": mean, "std": std}
    try:
        given = json.loads(text)
        if not isinstance(given, dict):
            raise ValueError("not an object")
        return Preprocess.model_validate(given).model_dump(include=set(given))
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        known = ", ".join(sorted(PREPROCESSING_NAMES))
        raise InputError(
            f"{where}: {text!r} names no known preprocessing ({known}) and is no JSON preprocess table ({e})",
            hint="give the preprocessing with --color/--mean/--std or a model card (--card)",
        ) from None


# --- TFLite metadata: a flatbuffer (tflite-support's metadata_schema.fbs) in the buffer named TFLITE_METADATA


def _tflite_metadata(data: bytes, facts: ModelFacts) -> None:
    import tflite

    model = tflite.Model.GetRootAsModel(data, 0)
    buffer = None
    for i in range(model.MetadataLength()):
        if model.Metadata(i).Name() == b"TFLITE_METADATA":
            buffer = model.Buffers(model.Metadata(i).Buffer()).DataAsNumpy()
    subgraph = model.Subgraphs(0)
    for i in range(subgraph.OutputsLength()):
        t = subgraph.Tensors(subgraph.Outputs(i))
        facts.outputs.append((t.Name().decode(), [int(d) for d in t.ShapeAsNumpy()], None))
    if buffer is None or not hasattr(buffer, "tobytes"):
        return
    try:
        _read_metadata(bytearray(buffer.tobytes()), data, facts)
    except (IndexError, ValueError, struct.error, zipfile.BadZipFile, KeyError):  # UnicodeDecodeError: a ValueError
        return  # metadata that does not parse says nothing


def _read_metadata(meta: bytearray, model_bytes: bytes, facts: ModelFacts) -> None:
    import flatbuffers
    from flatbuffers.number_types import Float32Flags, Uint8Flags
    from flatbuffers.table import Table

    def offset(t: Table, slot: int) -> int:
        return int(t.Offset(4 + 2 * slot))

    def table(t: Table, slot: int) -> Table | None:
        o = offset(t, slot)
        return Table(t.Bytes, t.Indirect(o + t.Pos)) if o else None

    def tables(t: Table | None, slot: int) -> list[Table]:
        o = offset(t, slot) if t is not None else 0
        if not o or t is None:
            return []
        start = t.Vector(o)
        return [Table(t.Bytes, t.Indirect(start + 4 * i)) for i in range(t.VectorLen(o))]

    def byte(t: Table, slot: int) -> int:
        o = offset(t, slot)
        return int(t.Get(Uint8Flags, o + t.Pos)) if o else 0

    def floats(t: Table, slot: int) -> list[float]:
        o = offset(t, slot)
        if not o:
            return []
        start = t.Vector(o)
        return [float(t.Get(Float32Flags, start + 4 * i)) for i in range(t.VectorLen(o))]

    def string(t: Table, slot: int) -> str | None:
        o = offset(t, slot)
        return t.String(o + t.Pos).decode() if o else None

    root = Table(meta, flatbuffers.encode.Get(flatbuffers.packer.uoffset, meta, 0))
    subgraphs = tables(root, 3)  # ModelMetadata.subgraph_metadata
    if not subgraphs:
        return
    inputs, outputs = tables(subgraphs[0], 2), tables(subgraphs[0], 3)  # input/output_tensor_metadata
    found: dict[str, Any] = {}
    if inputs:
        content = table(inputs[0], 3)  # TensorMetadata.content
        if content is not None and byte(content, 0) == 2:  # content_properties_type: ImageProperties
            props = table(content, 1)
            space = byte(props, 0) if props is not None else 0  # color_space: 1 RGB, 2 GRAYSCALE
            found |= {1: {"color": "rgb"}, 2: {"color": "gray"}}.get(space, {})
        for unit in tables(inputs[0], 4):  # process_units
            if byte(unit, 0) == 1:  # options_type: NormalizationOptions
                options = table(unit, 1)
                if options is not None and floats(options, 0) and floats(options, 1):
                    found |= {"mean": floats(options, 0), "std": floats(options, 1)}
    if facts.inputs[0].dtype in ("uint8", "int8"):
        # normalisation of a quantized input is done by its quantization parameters, not on the pixels
        found.pop("mean", None)
        found.pop("std", None)
    if found:
        facts.preprocess = found
        facts.found_in = "the model's TFLite metadata"
    for file in tables(outputs[0], 6) if outputs else []:  # TensorMetadata.associated_files
        name = string(file, 0)
        if byte(file, 2) == 2 and name:  # type: TENSOR_AXIS_LABELS
            with zipfile.ZipFile(io.BytesIO(model_bytes)) as z:
                lines = z.read(name).decode().splitlines()
            while lines and not lines[-1].strip():
                lines.pop()
            facts.labels = lines or None
            break


# --- a build or eval without a card


def complete_card(
    model: Path, card: ModelCard, given: set[str], command: str = "build"
) -> tuple[ModelCard, str | None]:
    """`card` (made from defaults and the command line, no card file) with what the model says about its
    preprocessing; `given`: the preprocess fields the command line set. Refuses (InputError, exit 2) a model
    with an image input whose colour order or normalisation nobody gave. Returns the card and a note on what
    came from where (None when nothing did)."""
    if "color" in given and {"mean", "std", "scale"} & given and model.suffix.lower() != ".tflite":
        return card, None  # all said: no need to read the model (a TFLite model may still bring labels)
    facts = read_facts(model)
    channels = facts.channels
    if channels is None:
        return card, None  # not an image tensor: nothing to preprocess
    from_model = facts.preprocess
    implied = facts.implied()
    have_color = "color" in given or "color" in from_model or "color" in implied
    have_norm = bool({"mean", "std", "scale"} & given) or {"mean", "std"} <= (from_model.keys() | implied.keys())
    missing = [k for k, ok in (("color", have_color), ("normalization", have_norm)) if not ok]
    if missing:
        fields = ", ".join(NEEDED[k][0] for k in missing)
        options = " and ".join(NEEDED[k][1] for k in missing) + (" (or --scale)" if "normalization" in missing else "")
        card_file = f"{model.stem}.toml"
        then = f"{command} with --card {card_file}"
        raise InputError(
            f"{model.name} has no model card and does not say how to preprocess its {channels}-channel input: "
            f"give {fields}",
            hint=(f"give {options}, or " if command == "build" else "")
            + f"write a starter card: edgedeploy card init {model} -o {card_file}, fill in its TODOs, then {then}",
        )
    skip = set(given) | ({"mean", "std"} if {"mean", "std", "scale"} & given else set())
    pre = card.preprocess.model_dump()
    notes = []
    for source, values in (("implied by the input", implied), (facts.found_in, from_model)):
        taken = {k: v for k, v in values.items() if k not in skip}
        if taken:
            pre |= taken
            notes.append(f"{', '.join(f'{k} {v}' for k, v in taken.items())} ({source})")
    update: dict[str, Any] = {"preprocess": Preprocess.model_validate(pre)}
    if card.labels is None and facts.labels:
        update["labels"] = facts.labels
        notes.append(f"{len(facts.labels)} labels ({facts.found_in or 'the model'})")
    return card.model_copy(update=update), ("; ".join(notes) or None)


def starter_card(model: Path) -> str:
    """A model card for `model` with what its file says filled in and a TODO for each field it does not:
    a card with a TODO left is refused (cards.load_card), so none builds with a guess."""
    facts = read_facts(model)
    pre = {**facts.implied(), **facts.preprocess}
    spec = facts.inputs[0]
    channels = facts.channels
    lines = [
        f"# Model card for {model.name}: what the model file cannot say. Written by `edgedeploy card init`.",
        '# Replace every "TODO: ..." (a card with one left is refused), then',
        f"#   edgedeploy build {model} --profile PROFILE --card THIS.toml",
        f"# Copied into {config_dir() / 'cards'}, builds of this file find it (by source_sha256) without --card.",
        "#",
        f"# input:  {spec.name} {spec.shape} {spec.dtype} {spec.layout or ''}".rstrip(),
    ]
    lines += [f"# output: {name} {shape}" + (f" (last op {op})" if op else "") for name, shape, op in facts.outputs]
    if facts.found_in:
        lines.append(f"# filled in from {facts.found_in}")
    lines += [
        "",
        f'name = "{default_name(model)}"',
        'version = "1"',
        'description = ""',
        f'source_sha256 = "{facts.sha256}"',
    ]
    if facts.labels:
        lines.append("labels = [" + ", ".join(json.dumps(label) for label in facts.labels) + "]")
    else:
        lines.append('# labels_file = "labels.txt"  # one label per line in output order, relative to this card')
    lines += ["", "[preprocess]"]
    if channels is None:
        lines.append(f"# {spec.name} is not an NCHW/NHWC image: camera frames cannot feed it; preprocess is unused")
    if "color" in pre:
        lines.append(f'color = "{pre["color"]}"')
    else:
        lines.append(
            'color = "TODO: rgb | bgr"  # the channel order the model was trained with (camera frames are BGR)'
        )
    lines += [
        'resize = "stretch"  # stretch | center_crop (then crop_fraction, e.g. 0.875 for ImageNet models)',
        'interpolation = "linear"  # area | linear | nearest',
        "scale = 1.0  # pixels (0..255) are multiplied by this first, then (x - mean) / std per channel",
    ]
    if "mean" in pre and "std" in pre:
        lines += [f"mean = {json.dumps(pre['mean'])}", f"std = {json.dumps(pre['std'])}"]
    else:
        lines += [
            'mean = "TODO: [0.0] raw pixels | [127.5] (x-127.5)/127.5 | [123.675, 116.28, 103.53] torchvision"',
            'std = "TODO: [1.0] raw pixels | [127.5] | [58.395, 57.12, 57.375] torchvision (255.0: x/255)"',
        ]
    last_op = facts.outputs[0][2] if facts.outputs else None
    width = _classes(facts.outputs[0][1]) if facts.outputs else None
    lines += ["", "[postprocess]", 'kind = "classifier"  # classifier | raw', "top_k = 5"]
    if last_op in ("Softmax", "Sigmoid"):
        lines.append(f"softmax = false  # the model ends in {last_op}: its outputs are probabilities already")
    else:
        lines.append("softmax = false  # true when the outputs are logits (scores become probabilities)")
    if width == 1001:
        lines.append('label_offset = "TODO: 1 if output 0 is background (1001 outputs, 1000 ImageNet classes), else 0"')
    else:
        lines.append("label_offset = 0  # output index minus this is the label index (1: output 0 is background)")
    return "\n".join(lines) + "\n"


def _classes(shape: list[Any]) -> int | None:
    """Outputs per sample of a [N, C] (or [C]) output, when static."""
    dims = shape[1:] if len(shape) > 1 else shape
    if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    n = 1
    for d in dims:
        n *= d
    return n
