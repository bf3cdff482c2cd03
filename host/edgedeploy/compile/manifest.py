"""Manifest assembly, shared by every bundle writer (the TVM build in package.py, the TensorRT writer in
tensorrt_artifacts.py): the card's facts, the target, the artifacts, and what a writer returns."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import Manifest, ModelInfo, Provenance, Quantization, Target, describe_artifact

from ..build_store import keep
from ..profiles import DeviceProfile
from .cards import ModelCard
from .frontends.load import frontend_name
from .frontends.model import SOURCE_ROLES, ForeignModel
from .frontends.onnx_model import OnnxModel


@dataclass
class BuildResult:
    bundle: Path
    manifest: Manifest
    cached: bool
    timings: dict[str, float] = field(default_factory=dict)


def profile_target(profile: DeviceProfile, **runtime: Any) -> Target:
    """What a device must provide: the profile's part (arch, GPU, driver, CPU flags) plus the runtime's. The
    profile's driver floor reason speaks of the TVM runtime and its device code: TensorRT bundles go without it."""
    tvm = runtime.get("runtime", "tvm") == "tvm"
    return Target(
        arch=profile.arch,
        device=profile.device,
        cuda_sm=profile.cuda_sm,
        min_cuda_driver=profile.platform.min_cuda_driver,
        driver_floor_reason=profile.platform.driver_floor_reason if tvm else None,
        cpu_features=list(profile.compiler.cpu_features),
        **runtime,
    )


# Every artifact file name a bundle writer may use, and its role in the manifest. The source model is
# never an artifact: it stays in the host's build store (manifest.host_files).
ARTIFACT_ROLES = {
    "model.so": "tvm-library",
    "model.qdq.onnx": "qdq-onnx",
    "labels.txt": "labels",
    "reference.npz": "tensorrt-reference",
    "model.ptx": "cuda-ptx",  # nvrtc-11 builds: the PTX of the library's CUDA module (compile/cuda/nvrtc11.py)
    "preprocess.so": "tvm-preprocess",  # GPU builds: the preprocessing kernel (compile/preprocess_kernel.py)
}


def write_labels(work: Path, card: ModelCard, files: dict[str, Path]) -> None:
    """labels.txt from the card, when it has labels."""
    if card.labels:
        files["labels.txt"] = work / "labels.txt"
        files["labels.txt"].write_text("\n".join(card.labels) + "\n", encoding="utf-8")


def card_manifest(
    card: ModelCard,
    model: OnnxModel | ForeignModel,
    name: str,
    profile: DeviceProfile,
    target: Target,
    outputs: list[Any],
    files: dict[str, Path],
    quantization: Quantization,
    provenance: Provenance,
    host_only: Mapping[str, Path] | None = None,
    **extra: Any,
) -> Manifest:
    """The manifest every bundle writer makes: model facts, the card's pre/post-processing, labels and
    health objectives, the target and the artifacts (described from `files`). The source model and the
    `host_only` files (name -> path) go to the host's build store, named in `host_files`."""
    role = SOURCE_ROLES[frontend_name(model)]
    host_files = [keep(model.path, role, model.path.name, model.sha256)]
    host_files += [keep(p, ARTIFACT_ROLES[n], n) for n, p in sorted((host_only or {}).items())]
    if role != "onnx-model":  # agents that read schema 2 do not know this source role (plan_push refuses them)
        extra.setdefault("schema_version", 3)
    if target.driver_floor_reason or profile.twin_of or "model.ptx" in files:  # fields schema 3 agents refuse
        extra["schema_version"] = 4
    if "preprocess.so" in files:  # a role schema 4 agents refuse
        extra["schema_version"] = 5
    if profile.twin_of:
        extra.setdefault("twin_of", profile.twin_of)
    return Manifest(
        model=ModelInfo(name=name, version=card.version, description=card.description, source_sha256=model.sha256),
        created=dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
        profile=profile.name,
        target=target,
        inputs=model.inputs,
        outputs=outputs,
        preprocess=card.preprocess,
        postprocess=card.postprocess,
        labels="labels.txt" if "labels.txt" in files else None,
        quantization=quantization,
        health=card.health,
        provenance=provenance,
        artifacts=[describe_artifact(p, ARTIFACT_ROLES[n], n) for n, p in sorted(files.items())],
        host_files=host_files,
        **extra,
    )
