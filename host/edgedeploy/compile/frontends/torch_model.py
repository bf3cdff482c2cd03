"""PyTorch models: a `torch.export` ExportedProgram file (.pt2), imported with TVM's `from_exported_program`.

Why this route and not ONNX export: TVM 0.27's `from_exported_program` reads the program torch.export
made, with no second converter in between, and its unsupported operators are known before anything is
compiled (they are listed by ATen name and node here). torch is an optional extra
(`pip install 'edgedeploy[torch]'`); `torch.export.save(torch.export.export(module, (example,)), "m.pt2")`
makes the file. Inputs must have static shapes (a dynamic batch dimension becomes `--batch`).
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import TensorSpec

from ...errors import ModelError
from ..stage import BuildContext, stage
from .model import ForeignModel, guess_layout, import_failure, output_specs

_HINT = "see docs/troubleshooting.md#models"


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ModelError(
            "reading PyTorch ExportedProgram files (.pt2) needs torch", hint="pip install 'edgedeploy[torch]'"
        ) from None
    return torch


def _load(path: Path) -> Any:
    torch = _torch()
    hint = "save one with torch.export.save(torch.export.export(module, (example_input,)), PATH); " + _HINT
    if not zipfile.is_zipfile(path):  # torch.export.load logs a traceback on such a file before it raises
        raise ModelError(f"{path} is not a readable torch.export program (not a .pt2 archive)", hint=hint)
    try:
        return torch.export.load(str(path))
    except Exception as e:  # zip, pickle and version errors of many types
        first = next((line for line in str(e).strip().splitlines() if line.strip()), type(e).__name__)
        raise ModelError(f"{path} is not a readable torch.export program: {first}", hint=hint) from None


def _decomposed(path: Path, ep: Any) -> Any:
    """The program in core ATen ops (what TVM's importer converts), with every operator checked."""
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    ep = ep.run_decompositions()
    known = ExportedProgramImporter().convert_map
    bad = [
        (node.target.__name__, node.name)
        for node in ep.graph.nodes
        if node.op == "call_function" and node.target.__name__ not in known
    ]
    if bad:
        kind, node = bad[0]
        others = sorted({b[0] for b in bad[1:]} - {kind})
        more = f" (also unsupported: {', '.join(others)})" if others else ""
        raise ModelError(
            f"{path}: operator {kind} (node {node!r}) is not supported by TVM's PyTorch frontend{more}", hint=_HINT
        )
    return ep


def _dtype(t: Any) -> str:
    return str(t).removeprefix("torch.")


def load_exported_program(path: Path, batch: int = 1) -> ForeignModel:
    """Read a .pt2 file, check its operators, and derive its input specs (static shapes)."""
    data = path.read_bytes()
    ep = _decomposed(path, _load(path))
    user = list(ep.graph_signature.user_inputs)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    inputs = []
    for name in user:
        node = placeholders.get(name)
        val = node.meta.get("val") if node is not None else None
        if val is None or not hasattr(val, "shape"):
            raise ModelError(f"{path}: input {name} is not a tensor", hint=_HINT)
        shape: list[int] = []
        for d, dim in enumerate(val.shape):
            if isinstance(dim, int):
                shape.append(dim)
            elif d == 0:
                shape.append(batch)
            else:
                raise ModelError(f"{path}: input {name} has a dynamic dimension {d}", hint=_HINT)
        inputs.append(TensorSpec(name=name, shape=shape, dtype=_dtype(val.dtype), layout=guess_layout(shape)))
    if not inputs:
        raise ModelError(f"{path}: the program has no inputs", hint=_HINT)
    return ForeignModel(path=path, sha256=hashlib.sha256(data).hexdigest(), inputs=inputs, frontend="torch")


@stage("import-torch")
def import_torch(ctx: BuildContext) -> None:
    """Relax from the ExportedProgram (TVM's from_exported_program), weights bound as constants."""
    from tvm.relax.frontend.torch import from_exported_program

    path = ctx.model.path
    ep = _decomposed(path, _load(path))
    try:
        ctx.ir = from_exported_program(ep, unwrap_unit_return_tuple=True, run_ep_decomposition=False)
    except Exception as e:  # the importer raises many types; name the model and the last line
        raise ModelError(f"{path}: TVM cannot import this PyTorch program: {import_failure(e)}", hint=_HINT) from None
    names = [str(n) for n in ep.graph_signature.user_outputs]
    ctx.outputs = output_specs(ctx.ir, names)
