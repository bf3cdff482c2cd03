"""`edgedeploy eval`, and the INT8 options of `edgedeploy build` turned into an Int8Config."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, cast, get_args

import typer

from ..errors import InputError
from . import render
from .options import JsonOpt, SourceOpt, in_range

if TYPE_CHECKING:
    from edgedeploy_agent.bundle import Quantization

    from ..compile.int8.build import Int8Config


def int8_config(
    int8: bool,
    calibration: Path | None,
    *,
    method: str,
    percentile: float,
    per_channel: bool,
    symmetric: bool,
    samples: int,
    keep_float: list[str],
    power_of_two: bool,
    equalize: bool,
    bias_correction: bool,
    refine: bool | None,
    eval_data: Path | None,
    eval_limit: int | None,
    synsets: Path | None,
    max_top1_drop: float | None,
    auto_fallback: bool,
) -> Int8Config | None:
    from ..compile.int8.build import Int8Config
    from ..compile.int8.quantize import Method, QuantizeOptions

    if not int8:
        if calibration or eval_data or max_top1_drop is not None or auto_fallback:
            raise InputError("--calibration, --eval, --max-top1-drop and --auto-fallback need --int8")
        return None
    if calibration is None:
        raise InputError(
            "--int8 (or --precision int8) needs --calibration (an image folder, a video file or .npy batches)"
        )
    for option, path in (("--calibration", calibration), ("--eval", eval_data), ("--synsets", synsets)):
        if path is not None and not path.exists():
            raise InputError(f"{option} {path} does not exist")
    method = method.strip().lower()
    if method not in get_args(Method):
        raise InputError(f"unknown calibration method {method!r}", hint=f"choose one of {', '.join(get_args(Method))}")
    if (max_top1_drop is not None or auto_fallback) and eval_data is None:
        raise InputError("--max-top1-drop and --auto-fallback need --eval DIR (labeled images)")
    if auto_fallback and max_top1_drop is None:
        raise InputError("--auto-fallback needs --max-top1-drop")
    opts = QuantizeOptions(
        method=cast(Method, method),  # checked against Method above
        percentile=percentile,
        per_channel=per_channel,
        symmetric_activations=symmetric,
        samples=samples,
        keep_float=tuple(k.strip() for spec in keep_float for k in spec.split(",") if k.strip()),
        power_of_two=power_of_two,
        equalize=equalize,
        bias_correction=bias_correction,
        refine=refine,
    )
    return Int8Config(
        calibration=calibration,
        options=opts,
        eval_data=eval_data,
        eval_limit=eval_limit,
        synsets=synsets,
        max_top1_drop=max_top1_drop,
        auto_fallback=auto_fallback,
    )


def int8_summary(q: Quantization) -> str:
    acc = q.accuracy
    if q.calibration is None:  # pre-quantized (a TFLite QAT model): the model's own scales
        parts = [f"INT8 {q.method}"]
    else:
        secs = q.options.get("calibration_seconds")
        took = f" in {float(secs):.0f} s" if secs else ""
        parts = [f"INT8 {q.method}, {q.calibration_samples} calibration samples from {q.calibration}{took}"]
    if acc:
        parts.append(
            f"top-1 FP32 {acc['fp32_top1']:.2f}% -> INT8 {acc['int8_top1']:.2f}% (drop {acc['top1_drop']:.2f}, "
            f"agreement {acc['top1_agreement']:.2f}%, {int(acc['eval_images'])} images of {q.evaluation})"
        )
    parts.append(f"float layers: {', '.join(q.float_layers) or 'none'}")
    if q.float_in_runtime:
        parts.append(f"float in TVM: {'; '.join(q.float_in_runtime)}")
    return "; ".join(parts)


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_(
        target: Annotated[Path, typer.Argument(help="bundle (.edb) or ONNX model")],
        data: Annotated[Path, typer.Option("--data", help="labeled images: wnid_name.jpg files, class folders, MNIST")],
        card: Annotated[Path | None, typer.Option(help="ONNX models: model card with the preprocessing")] = None,
        split: Annotated[
            str, typer.Option(help="auto | all | calibration | evaluation (auto: skip the calibration half)")
        ] = "auto",
        limit: Annotated[int | None, typer.Option(help="use at most this many images", callback=in_range(1))] = None,
        synsets: Annotated[Path | None, typer.Option(help="wnid list in class order (ImageNet-style folders)")] = None,
        source: SourceOpt = None,
        json_: JsonOpt = False,
    ) -> None:
        """Top-1/top-5 on a labeled set; INT8 bundles also: agreement with FP32 and with the exact INT8 reference."""
        from .. import api
        from ..compile.cards import card_for

        if split not in ("auto", "all", "calibration", "evaluation"):
            raise InputError(f"unknown split {split!r}", hint="choose auto, all, calibration or evaluation")
        model_card, card_path = card_for(target, card)
        if card_path is None and target.suffix.lower() == ".onnx":  # a bundle carries its preprocessing
            from ..compile.model_facts import complete_card

            model_card, note = complete_card(target, model_card, set(), command="eval")
            if note:
                render.info(f"no model card; preprocessing from the model: {note}")
        result = api.evaluate(target, data, model_card, split, limit, synsets, source or ())
        if json_:
            render.print_json(result)
            return
        rows = [[k, v] for k, v in result.items()]
        render.table(f"accuracy of {target.name}", ["metric", "value"], rows)
