"""Build a bundle: model + profile + model card -> compiled library -> bundle file (cached by inputs)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import platform
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgedeploy_agent.bundle import (
    HealthSpec,
    Manifest,
    ModelInfo,
    Postprocess,
    Preprocess,
    Provenance,
    Target,
    describe_artifact,
    write_bundle,
)

from .. import __version__
from ..errors import InputError
from ..paths import cache_dir
from ..profiles import DeviceProfile
from .onnx_model import load_onnx
from .pipeline import BuildContext, run_pipeline


class ModelCard(BaseModel):
    """What the model file cannot say: name, version, labels, preprocessing, post-processing."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    version: str = "1"
    description: str = ""
    labels: list[str] | None = None
    labels_file: str | None = Field(default=None, description="path relative to the card, one label per line")
    preprocess: Preprocess = Field(default_factory=Preprocess)
    postprocess: Postprocess = Field(default_factory=Postprocess)
    health: HealthSpec | None = Field(default=None, description="health objectives checked on every device")


def load_card(path: Path) -> ModelCard:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"model card {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"model card {path} is not valid TOML: {e}") from None
    try:
        card = ModelCard.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"model card {path}: {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    if card.labels_file:
        card = card.model_copy(update={"labels": read_labels(path.parent / card.labels_file), "labels_file": None})
    return card


def read_labels(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise InputError(f"cannot read labels file {path}: {e.strerror}") from None
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputError(f"labels file {path} is empty")
    return lines


@dataclass
class BuildResult:
    bundle: Path
    manifest: Manifest
    cached: bool
    timings: dict[str, float] = field(default_factory=dict)


def build_bundle(
    model_path: Path,
    profile: DeviceProfile,
    out: Path,
    card: ModelCard,
    progress: Callable[[str], None] = lambda step: None,
    use_cache: bool = True,
) -> BuildResult:
    """Compile `model_path` for `profile` and write a bundle to `out`."""
    progress("load-model")
    model = load_onnx(model_path)
    name = card.name or _default_name(model_path)
    key = _cache_key(model.sha256, profile, card, name)
    cached = cache_dir() / "builds" / key / "bundle.edb"
    if use_cache and cached.is_file():
        progress("cache-hit")
        _copy_atomic(cached, out)
        from edgedeploy_agent.bundle import read_manifest

        return BuildResult(out, read_manifest(out), cached=True)

    from .tvm_backend import runtime_abi, tool_versions

    with tempfile.TemporaryDirectory(prefix="edgedeploy-build-") as tmp:
        work = Path(tmp)
        ctx = run_pipeline(BuildContext(model=model, profile=profile, work_dir=work, progress=progress))
        assert ctx.library is not None
        progress("package")
        files: dict[str, Path] = {"model.so": ctx.library}
        shutil.copyfile(model_path, work / "model.onnx")
        files["model.onnx"] = work / "model.onnx"
        labels_name = None
        if card.labels:
            (work / "labels.txt").write_text("\n".join(card.labels) + "\n", encoding="utf-8")
            files["labels.txt"] = work / "labels.txt"
            labels_name = "labels.txt"
        roles = {"model.so": "tvm-library", "model.onnx": "onnx-model", "labels.txt": "labels"}
        manifest = Manifest(
            model=ModelInfo(name=name, version=card.version, description=card.description, source_sha256=model.sha256),
            created=dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
            profile=profile.name,
            target=Target(
                arch=profile.arch,
                device=profile.device,
                cuda_sm=profile.cuda_sm,
                min_cuda_driver=profile.platform.min_cuda_driver,
                runtime="tvm",
                runtime_abi=runtime_abi(),
            ),
            inputs=model.inputs,
            outputs=ctx.outputs,
            preprocess=card.preprocess,
            postprocess=card.postprocess,
            labels=labels_name,
            health=card.health,
            provenance=Provenance(
                tools={"edgedeploy": __version__, "python": platform.python_version(), **tool_versions()},
                build_host=f"{platform.node()} ({platform.machine()})",
                options={"pipeline": ",".join(ctx.timings), "cache_key": key},
            ),
            artifacts=[describe_artifact(p, roles[n], n) for n, p in sorted(files.items())],
        )
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_bundle(cached, manifest, files)
    _copy_atomic(cached, out)
    return BuildResult(out, manifest, cached=False, timings=ctx.timings)


def _default_name(path: Path) -> str:
    stem = "".join(c if c.isalnum() or c in "._-" else "-" for c in path.stem)
    return stem.lstrip("._-")[:64] or "model"


def _cache_key(model_sha: str, profile: DeviceProfile, card: ModelCard, name: str) -> str:
    from .tvm_backend import tool_versions

    parts: dict[str, Any] = {
        "model": model_sha,
        "profile": profile.model_dump(mode="json"),
        "card": card.model_dump(mode="json"),
        "name": name,
        "edgedeploy": __version__,
        "tools": tool_versions(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _copy_atomic(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)
