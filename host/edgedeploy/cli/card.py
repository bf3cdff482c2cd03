"""`edgedeploy card init`: a starter model card, made from what the model file says about itself."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import tomllib
import typer

from ..errors import InputError
from ..userfiles import write_text_atomic
from . import render

app = typer.Typer(help="Model cards: what a model file cannot say (preprocessing, labels).", no_args_is_help=True)


@app.command()
def init(
    model: Annotated[Path, typer.Argument(help="model file: .onnx, .tflite, or .pt2")],
    out: Annotated[Path | None, typer.Option("-o", "--out", help="card file to write (default: print it)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing card file")] = False,
) -> None:
    """Write a starter model card for MODEL: its inputs and outputs as comments, what the file says about its
    preprocessing (ONNX metadata, TFLite metadata, a one-channel or uint8 input) filled in, and a TODO for every
    field it does not say. A card with a TODO left is refused, so fill them in, then build with --card."""
    from ..compile.cards import todo_fields
    from ..compile.model_facts import starter_card

    text = starter_card(model)
    if out is None:
        sys.stdout.write(text)
        return
    if out.exists() and not force:
        raise InputError(f"{out} exists", hint="--force replaces it, or choose another -o")
    write_text_atomic(out, text, "model card")
    todo = todo_fields(tomllib.loads(text))
    left = f"; fill in {', '.join(todo)}" if todo else ""
    render.info(f"wrote {out}{left}, then: edgedeploy build {model} --profile PROFILE --card {out}")
