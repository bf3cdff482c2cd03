"""`edgedeploy build` and `edgedeploy inspect`."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import InputError
from ..paths import build_store_dir
from ..profiles import get_profile
from . import render
from .int8 import int8_config, int8_summary
from .options import JsonOpt, bundle_path, cuda_config_from_env, in_range

if TYPE_CHECKING:
    from edgedeploy_agent.bundle import Manifest, Target


def _floats(text: str | None, what: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise InputError(f"--{what} takes comma-separated numbers, got {text!r}") from None


def register(app: typer.Typer) -> None:
    @app.command()
    def build(
        model: Annotated[Path, typer.Argument(help="model file: .onnx, .tflite, or .pt2 (torch.export program)")],
        profile: Annotated[str, typer.Option("--profile", "-p", help="device profile (edgedeploy profiles list)")],
        out: Annotated[Path | None, typer.Option("-o", "--out", help="bundle file (default MODEL.PROFILE.edb)")] = None,
        card: Annotated[Path | None, typer.Option(help="model card TOML: name, version, labels, preprocess")] = None,
        name: Annotated[str | None, typer.Option(help="model name (default: file name)")] = None,
        version: Annotated[str | None, typer.Option(help="model version")] = None,
        labels: Annotated[Path | None, typer.Option(help="labels file, one per line")] = None,
        color: Annotated[str | None, typer.Option(help="rgb | bgr | gray")] = None,
        resize: Annotated[str | None, typer.Option(help="stretch | center_crop")] = None,
        crop_fraction: Annotated[
            float | None,
            typer.Option(help="center_crop: kept part of the short side", callback=in_range(0, 1, low_open=True)),
        ] = None,
        scale: Annotated[float | None, typer.Option(help="multiply pixels (0..255) by this first")] = None,
        mean: Annotated[str | None, typer.Option(help="per-channel mean, e.g. 127.5,127.5,127.5")] = None,
        std: Annotated[str | None, typer.Option(help="per-channel std")] = None,
        top_k: Annotated[int | None, typer.Option(help="predictions to report per frame", callback=in_range(1))] = None,
        softmax: Annotated[bool | None, typer.Option("--softmax/--no-softmax", help="outputs are logits")] = None,
        label_offset: Annotated[int | None, typer.Option(help="output index minus this = label index")] = None,
        precision: Annotated[
            str, typer.Option(help="fp32 | fp16 (GPU profiles) | int8 (same as --int8); any case")
        ] = "fp32",
        cuda_graph: Annotated[
            bool, typer.Option("--cuda-graph/--no-cuda-graph", help="GPU: capture CUDA graphs")
        ] = True,
        no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild even if cached")] = False,
        int8: Annotated[bool, typer.Option("--int8", help="quantize to INT8 (needs --calibration)")] = False,
        calibration: Annotated[
            Path | None, typer.Option(help="calibration data: image folder, video file or .npy batches")
        ] = None,
        method: Annotated[str, typer.Option(help="calibration: minmax | entropy | percentile")] = "minmax",
        percentile: Annotated[
            float,
            typer.Option(help="percentile method: the kept percentile", callback=in_range(0, 100, low_open=True)),
        ] = 99.999,
        per_channel: Annotated[bool, typer.Option("--per-channel/--per-tensor", help="weight scales")] = True,
        symmetric: Annotated[
            bool, typer.Option("--symmetric", help="symmetric INT8 activations, zero point 0 (TensorRT)")
        ] = False,
        samples: Annotated[int, typer.Option(help="calibration samples", callback=in_range(1))] = 128,
        keep_float: Annotated[
            list[str] | None,
            typer.Option(help="layer name, glob or preset (first, last, first-last) to keep in float; repeatable"),
        ] = None,
        power_of_two: Annotated[bool, typer.Option("--power-of-two", help="round scales up to powers of 2")] = False,
        equalize: Annotated[
            bool, typer.Option("--equalize/--no-equalize", help="cross-layer equalization before calibration")
        ] = False,
        bias_correction: Annotated[
            bool, typer.Option("--bias-correction/--no-bias-correction", help="correct the weight rounding bias")
        ] = True,
        refine: Annotated[
            bool | None,
            typer.Option(
                "--refine/--no-refine",
                help="layer-wise refinement: centred ReLU6, MSE clipping, learned rounding, bias correction "
                "(default: on with --symmetric, off for --runtime tensorrt: docs/int8.md)",
            ),
        ] = None,
        eval_data: Annotated[
            Path | None, typer.Option("--eval", help="labeled images to measure FP32 vs INT8 top-1 on")
        ] = None,
        eval_limit: Annotated[
            int | None, typer.Option(help="use at most this many evaluation images", callback=in_range(1))
        ] = None,
        synsets: Annotated[Path | None, typer.Option(help="wnid list in class order (ImageNet-style folders)")] = None,
        max_top1_drop: Annotated[
            float | None,
            typer.Option(
                help="fail the build when INT8 top-1 drops more points than this (negative: INT8 must gain)",
                callback=in_range(-100, 100),
            ),
        ] = None,
        auto_fallback: Annotated[
            bool, typer.Option("--auto-fallback", help="on a failed gate keep the most sensitive layers in float")
        ] = False,
        runtime: Annotated[
            str, typer.Option(help="tvm (compile a library) | tensorrt (Q/DQ ONNX; the device builds the engine)")
        ] = "tvm",
        batch: Annotated[
            str | None,
            typer.Option(help="TVM: the static batch N the library is compiled for; tensorrt: MIN:OPT:MAX"),
        ] = None,
        workspace_mib: Annotated[
            int, typer.Option(help="tensorrt: builder workspace limit in MiB", callback=in_range(1))
        ] = 1024,
        twin: Annotated[
            bool,
            typer.Option(
                "--twin",
                hidden=True,
                help="a twin of the profile (t4, xavier-*): its device code as PTX with an x86_64 host library, "
                "to run its kernels on a newer GPU (docs/gpu.md)",
            ),
        ] = False,
        json_: JsonOpt = False,
    ) -> None:
        """Compile a model for a device profile and write a bundle (INT8 with --int8 --calibration)."""
        from .. import api
        from ..compile.build_options import check_options
        from ..compile.cards import card_for, card_with

        int8_cfg = int8_config(
            int8 or precision.strip().lower() == "int8",
            calibration,
            method=method,
            percentile=percentile,
            per_channel=per_channel,
            symmetric=symmetric,
            samples=samples,
            keep_float=keep_float or [],
            power_of_two=power_of_two,
            equalize=equalize,
            bias_correction=bias_correction,
            refine=refine,
            eval_data=eval_data,
            eval_limit=eval_limit,
            synsets=synsets,
            max_top1_drop=max_top1_drop,
            auto_fallback=auto_fallback,
        )
        # every option checked before the model is read: one line, exit 2, with the valid choices
        runtime, precision, _ = check_options(
            model, get_profile(profile), runtime, precision, batch, int8_cfg is not None
        )
        gpu = get_profile(profile).device == "cuda" and runtime == "tvm"
        cuda = {"cuda": cuda_config_from_env()} if gpu else {}
        base, card_path = card_for(model, card)
        if card_path is not None and card is None:
            render.info(f"model card: {card_path} (it names this model's sha256)")
        color, resize = (v.strip().lower() if v is not None else None for v in (color, resize))
        pre: dict[str, object] = {"color": color, "resize": resize, "crop_fraction": crop_fraction, "scale": scale}
        pre |= {"mean": _floats(mean, "mean"), "std": _floats(std, "std")}
        post = {"top_k": top_k, "softmax": softmax, "label_offset": label_offset}
        merged = card_with(base, name, version, labels, pre, post)
        if card_path is None:  # no card: the preprocessing comes from the options or the model file, or none
            from ..compile.model_facts import complete_card

            merged, note = complete_card(model, merged, {k for k, v in pre.items() if v is not None})
            if note:
                render.info(f"no model card; preprocessing from the model: {note}")
        from ..compile.twin import TWIN_SUFFIX

        target = bundle_path(out or model.with_suffix(f".{profile}{TWIN_SUFFIX if twin else ''}.edb"))
        t = time.perf_counter()
        with render.steps(f"build {model.name} for {profile}") as step:
            result = api.build(
                model,
                profile,
                target,
                merged,
                runtime=runtime,
                batch=batch,
                precision=precision,
                cuda_graph=cuda_graph,
                use_cache=not no_cache,
                int8=int8_cfg,
                workspace_mib=workspace_mib,
                twin=twin,
                progress=step,
                **cuda,
            )
        secs = time.perf_counter() - t
        m = result.manifest
        if json_:
            render.print_json(
                {
                    "bundle": str(result.bundle),
                    "bundle_id": m.bundle_id,
                    "cached": result.cached,
                    "seconds": round(secs, 3),
                    "timings": result.timings,
                    "quantization": m.quantization.model_dump(mode="json"),
                }
            )
            return
        how = "from cache" if result.cached else "compiled"
        render.out.print(
            f"wrote {result.bundle} ({result.bundle.stat().st_size / 1e6:.2f} MB, {how} in "
            f"{secs:.2f} s): {m.model.name} {m.model.version} for {m.profile}, id {m.bundle_id}"
        )
        if m.quantization.precision == "int8":
            render.out.print(int8_summary(m.quantization))
            for line in json.loads(m.quantization.options.get("layers", "[]")):
                render.out.print(f"  {line}", markup=False)

    @app.command()
    def inspect(bundle: Annotated[Path, typer.Argument(help="bundle file")], json_: JsonOpt = False) -> None:
        """Print a bundle's manifest (reads only the manifest): `artifacts` is what the device gets, `host_files`
        what stays in this host's build store (`host_store.missing`: what the store lacks)."""
        from .. import api
        from ..build_store import missing

        m = api.inspect_bundle(bundle)
        lost = missing(m)
        if json_:
            store = {"path": str(build_store_dir()), "missing": [h.name for h in lost]}
            floor = {"min_cuda_driver": m.target.min_cuda_driver, "reason": m.target.driver_floor_reason}
            render.print_json(
                {
                    "bundle_id": m.bundle_id,
                    "release": m.release_name,
                    **m.model_dump(mode="json"),
                    "driver_floor": floor,
                    "host_store": store,
                }
            )
            return
        t = m.target
        rows = [
            ["model", f"{m.model.name} {m.model.version}  {m.model.description}"],
            ["bundle id", m.bundle_id],
            ["created", m.created.isoformat()],
            ["profile", m.profile],
            *([["twin of", f"{m.twin_of} (its device code as PTX, {t.arch} host code)"]] if m.twin_of else []),
            [
                "target",
                f"{t.arch} {t.device}" + (f" sm_{t.cuda_sm}" if t.cuda_sm else "") + f", {t.runtime} ({t.runtime_abi})",
            ],
            ["inputs", "; ".join(f"{s.name} {s.shape} {s.dtype} {s.layout or ''}" for s in m.inputs)],
            ["outputs", "; ".join(f"{s.name} {s.shape} {s.dtype}" for s in m.outputs)],
            ["preprocess", m.preprocess.model_dump_json()],
            ["postprocess", m.postprocess.model_dump_json()],
            ["precision", m.quantization.precision],
            *([["int8", int8_summary(m.quantization)]] if m.quantization.precision == "int8" else []),
            ["device code", ", ".join(t.device_code) or "-"],
            [
                "host library",
                f"{t.host_machine or '?'} ELF" + (f", device code by {t.cuda_codegen}" if t.cuda_codegen else ""),
            ],
            *([["driver floor", _driver_floor(t)]] if t.device == "cuda" else []),
            *([["tensorrt", _tensorrt_summary(m)]] if m.tensorrt else []),
            ["tools", ", ".join(f"{k} {v}" for k, v in m.provenance.tools.items())],
        ]
        rows += [[f"artifact {a.role}", f"{a.path} {a.size} B sha256 {a.sha256[:16]}…"] for a in m.artifacts]
        rows += [
            [f"host file {h.role}", f"{h.name} {h.size} B sha256 {h.sha256[:16]}… " + _where(h in lost)]
            for h in m.host_files
        ]
        render.table(str(bundle), ["field", "value"], rows)


def _driver_floor(t: Target) -> str:
    if not t.min_cuda_driver:
        return "none declared"
    return f"CUDA driver API {t.min_cuda_driver}+" + (f": {t.driver_floor_reason}" if t.driver_floor_reason else "")


def _where(lost: bool) -> str:
    return f"MISSING from the build store {build_store_dir()}" if lost else "(in the build store)"


def _tensorrt_summary(m: Manifest) -> str:
    t = m.tensorrt
    assert t is not None
    shapes = "; ".join(f"{p.input} min {p.min} opt {p.opt} max {p.max}" for prof in t.profiles for p in prof)
    return (
        f"{t.precision} from {t.onnx}, fp16 {t.fp16}, workspace {t.workspace_bytes >> 20} MiB, "
        f"opt level {t.builder_optimization_level}; profiles: {shapes}; acceptance on {t.reference}: "
        f"top-1 >= {t.min_top1_agreement}, atol {t.atol}"
        + (
            f" (reference vs FP32 top-1 at build: {t.reference_fp32_top1_agreement:.0%})"
            if t.reference_fp32_top1_agreement is not None
            else ""
        )
        + "; engine built on the device"
    )
