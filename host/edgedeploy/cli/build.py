"""`edgedeploy build` and `edgedeploy inspect`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from edgedeploy_agent.bundle import Postprocess, Preprocess

from .. import api
from ..compile.package import ModelCard, load_card, read_labels
from ..errors import InputError
from . import render
from .options import JsonOpt


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
        model: Annotated[Path, typer.Argument(help="ONNX model file")],
        profile: Annotated[str, typer.Option("--profile", "-p", help="device profile (edgedeploy profiles list)")],
        out: Annotated[Path | None, typer.Option("-o", "--out", help="bundle file (default MODEL.PROFILE.edb)")] = None,
        card: Annotated[Path | None, typer.Option(help="model card TOML: name, version, labels, preprocess")] = None,
        name: Annotated[str | None, typer.Option(help="model name (default: file name)")] = None,
        version: Annotated[str | None, typer.Option(help="model version")] = None,
        labels: Annotated[Path | None, typer.Option(help="labels file, one per line")] = None,
        color: Annotated[str | None, typer.Option(help="rgb | bgr | gray")] = None,
        resize: Annotated[str | None, typer.Option(help="stretch | center_crop")] = None,
        crop_fraction: Annotated[float | None, typer.Option(help="center_crop: kept part of the short side")] = None,
        scale: Annotated[float | None, typer.Option(help="multiply pixels (0..255) by this first")] = None,
        mean: Annotated[str | None, typer.Option(help="per-channel mean, e.g. 127.5,127.5,127.5")] = None,
        std: Annotated[str | None, typer.Option(help="per-channel std")] = None,
        top_k: Annotated[int | None, typer.Option(help="predictions to report per frame")] = None,
        softmax: Annotated[bool | None, typer.Option("--softmax/--no-softmax", help="outputs are logits")] = None,
        label_offset: Annotated[int | None, typer.Option(help="output index minus this = label index")] = None,
        precision: Annotated[str, typer.Option(help="fp32 | fp16 (GPU profiles)")] = "fp32",
        batch: Annotated[int, typer.Option(min=1, help="static batch size the library is compiled for")] = 1,
        cuda_graph: Annotated[
            bool, typer.Option("--cuda-graph/--no-cuda-graph", help="GPU: capture CUDA graphs")
        ] = True,
        no_cache: Annotated[bool, typer.Option("--no-cache", help="rebuild even if cached")] = False,
        json_: JsonOpt = False,
    ) -> None:
        """Compile a model for a device profile and write a bundle."""
        base = load_card(card) if card else ModelCard()
        pre = {
            k: v
            for k, v in {
                "color": color,
                "resize": resize,
                "crop_fraction": crop_fraction,
                "scale": scale,
                "mean": _floats(mean, "mean"),
                "std": _floats(std, "std"),
            }.items()
            if v is not None
        }
        post = {
            k: v for k, v in {"top_k": top_k, "softmax": softmax, "label_offset": label_offset}.items() if v is not None
        }
        try:
            merged = ModelCard.model_validate(
                {
                    **base.model_dump(),
                    **({"name": name} if name else {}),
                    **({"version": version} if version else {}),
                    **({"labels": read_labels(labels)} if labels else {}),
                    "preprocess": Preprocess.model_validate({**base.preprocess.model_dump(), **pre}),
                    "postprocess": Postprocess.model_validate({**base.postprocess.model_dump(), **post}),
                }
            )
        except ValidationError as e:
            err = e.errors()[0]
            raise InputError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        target = out or model.with_suffix(f".{profile}.edb")
        t = time.perf_counter()
        with render.steps(f"build {model.name} for {profile}") as step:
            result = api.build(
                model,
                profile,
                target,
                merged,
                progress=step,
                use_cache=not no_cache,
                precision=precision,
                cuda_graph=cuda_graph,
                batch=batch,
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
                }
            )
            return
        how = "from cache" if result.cached else "compiled"
        render.out.print(
            f"wrote {result.bundle} ({result.bundle.stat().st_size / 1e6:.2f} MB, {how} in "
            f"{secs:.2f} s): {m.model.name} {m.model.version} for {m.profile}, id {m.bundle_id}"
        )

    @app.command()
    def inspect(bundle: Annotated[Path, typer.Argument(help="bundle file")], json_: JsonOpt = False) -> None:
        """Print a bundle's manifest (reads only the manifest)."""
        m = api.inspect_bundle(bundle)
        if json_:
            render.print_json({"bundle_id": m.bundle_id, "release": m.release_name, **m.model_dump(mode="json")})
            return
        t = m.target
        rows = [
            ["model", f"{m.model.name} {m.model.version}  {m.model.description}"],
            ["bundle id", m.bundle_id],
            ["created", m.created.isoformat()],
            ["profile", m.profile],
            [
                "target",
                f"{t.arch} {t.device}" + (f" sm_{t.cuda_sm}" if t.cuda_sm else "") + f", {t.runtime} ({t.runtime_abi})",
            ],
            ["inputs", "; ".join(f"{s.name} {s.shape} {s.dtype} {s.layout or ''}" for s in m.inputs)],
            ["outputs", "; ".join(f"{s.name} {s.shape} {s.dtype}" for s in m.outputs)],
            ["preprocess", m.preprocess.model_dump_json()],
            ["postprocess", m.postprocess.model_dump_json()],
            ["precision", m.quantization.precision],
            ["device code", ", ".join(t.device_code) or "-"],
            [
                "host library",
                f"{t.host_machine or '?'} ELF" + (f", device code by {t.cuda_codegen}" if t.cuda_codegen else ""),
            ],
            ["tools", ", ".join(f"{k} {v}" for k, v in m.provenance.tools.items())],
        ] + [[f"artifact {a.role}", f"{a.path} {a.size} B sha256 {a.sha256[:16]}…"] for a in m.artifacts]
        render.table(str(bundle), ["field", "value"], rows)
