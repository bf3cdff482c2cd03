"""`edgedeploy tune` on a bundle: tune what it was built from with the build's own stages (up to
apply-tuning), then compile with the database as a check. The databases themselves: tuning.py."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from edgedeploy_agent.bundle import Manifest

from ..build_store import check_given, host_file
from ..errors import InputError
from .config import CudaConfig, TuneRequest
from .frontends.load import load_model
from .frontends.model import SOURCE_ROLES
from .frontends.onnx_model import load_onnx
from .package import compile_model
from .tuning.apply import adopt_file_keyed_database, database_dir, parse_tracker, user_root
from .tuning.key import tuning_key


@dataclass
class TuneResult:
    database: Path
    key: str
    tuned_kernels: list[str]  # after tuning: the kernels scheduled from the database
    kernel_count: int
    exported: Path | None  # runner "export": the folder holding the tuning module
    timings: dict[str, float]


def tune_model(
    bundle: Path,
    request: TuneRequest,
    progress: Callable[[str], None] = lambda step: None,
    sources: Sequence[Path] = (),
    cuda: CudaConfig = CudaConfig(),
) -> TuneResult:
    """Tune what a bundle was built from: its profile, precision, batch and exact (Q/DQ) model, found in the
    build store (or `sources`; schema 1 bundles carry it). The build's own stages run up to apply-tuning,
    which tunes (or exports the tuning module); then the library is compiled with the database as a check.
    Later builds of the same model apply `request.database`."""
    from edgedeploy_agent.bundle import extract_bundle, read_manifest

    from ..profiles import get_profile

    m = read_manifest(bundle)
    if m.target.runtime != "tvm":
        raise InputError(f"{bundle} is a {m.target.runtime} bundle: TensorRT picks its tactics on the device")
    profile = get_profile(m.profile)
    # a TFLite / PyTorch source is compiled as it is (its build's precision key is fp32, as in build_bundle)
    foreign = {r: f for f, r in SOURCE_ROLES.items() if f != "onnx"}
    source = next((h.role for h in m.host_files if h.role in foreign), None)
    precision = "fp32" if source is not None else m.quantization.precision
    role = source or ("qdq-onnx" if precision == "int8" else "onnx-model")
    check_given(m, sources, [role, "onnx-model"] if role == "qdq-onnx" else [role])
    with tempfile.TemporaryDirectory(prefix="edgedeploy-tune-") as tmp:
        work = Path(tmp)
        if any(a.role in (role, "onnx-model") for a in m.artifacts):  # a schema 1 bundle carries them
            extract_bundle(bundle, work / "bundle")
        path, batch = host_file(m, role, work / "bundle", sources), m.inputs[0].shape[0]
        # the store names files by sha256 (no suffix): the role says which frontend reads it
        model = load_onnx(path, batch=batch) if source is None else load_model(path, batch, foreign[source])
        # the key is the source model's, as the build's (an INT8 build compiles the Q/DQ model made from it)
        keyed = load_onnx(host_file(m, "onnx-model", work / "bundle", sources)) if role == "qdq-onnx" else model
        adopt_file_keyed_database(m.profile, keyed, precision)
        key = tuning_key(keyed, precision)
        if request.database is None:
            request = dataclasses.replace(request, database=database_dir(m.profile, key, user_root()))
        res = compile_model(model, profile, work, precision, m.target.cuda_graph, cuda, key, None, request, progress)
    exported = request.export_dir if res.library is None else None
    return TuneResult(request.db, key, res.tuned_kernels, res.kernel_count, exported, res.timings)


def tune_request(
    bundle: Path,
    manifest: Manifest,
    trials: int,
    tracker: str | None,
    key: str | None,
    export: Path | None,
    database: Path | None,
    cost_model: str,
    tasks: int,
) -> TuneRequest:
    """Who measures (here, a device through an RPC tracker, or elsewhere via export) and where the
    database goes (default: the user's, for the bundle's profile and model); refuses what cannot work."""
    if cost_model not in ("xgb", "random"):
        raise InputError(f"unknown --cost-model {cost_model!r}", hint="choose xgb or random")
    if tracker and export:
        raise InputError("choose one of --tracker and --export")
    if tracker:
        if not key:
            raise InputError("--tracker needs --key: the key the device's RPC server registered with")
        parse_tracker(tracker)
    runner = "rpc" if tracker else "export" if export else "local"
    if runner == "local" and manifest.target.device == "cuda":
        raise InputError(
            f"{bundle} is for a GPU ({manifest.profile}) and this machine measures only CPU code",
            hint="measure on the device: --tracker HOST:PORT --key KEY, or --export DIR for tune_offline",
        )
    return TuneRequest(
        trials=trials,
        database=database,  # None: the user's database for the model's key, which tune_model reads from the model
        runner=runner,
        tracker=tracker or "",
        key=key or "",
        export_dir=export,
        cost_model=cost_model,
        tasks=tasks,
    )
