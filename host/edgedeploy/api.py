"""The façade the CLI calls: build, tune, evaluate, inspect; devices, push, rollout, rollback, status, install.

Each function takes plain values, returns plain values and raises EdgeDeployError subclasses.
Nothing here prints or exits. The compile side is imported when called (TVM only for a build); the device
side is remote/'s, re-exported under the names the CLI uses.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgedeploy_agent.bundle import Manifest, read_manifest

from .errors import InputError, agent_input
from .inventory import select_devices as select_devices
from .profiles import get_profile
from .remote.device_ops import facts as facts
from .remote.device_ops import install_fleet_keys as install_fleet_keys
from .remote.device_ops import push_bundle as push_bundle
from .remote.device_ops import rollback as rollback
from .remote.device_ops import rollback_fleet as rollback_fleet
from .remote.device_ops import stop_agent as stop_agent
from .remote.device_ops import wait_finished as wait_finished
from .remote.enroll import enroll as enroll
from .remote.execute import PushOptions as PushOptions
from .remote.install_run import install_agent as install_agent
from .remote.rollout import Waves as Waves
from .remote.rollout_runner import load_rollout as load_rollout
from .remote.rollout_runner import resume_rollout as resume_rollout
from .remote.rollout_runner import rollout as rollout
from .remote.status import DeviceStatus as DeviceStatus
from .remote.status import fleet_status as fleet_status
from .remote.status import status as status
from .remote.status import stored_reports as stored_reports

if TYPE_CHECKING:  # the compile side (ONNX, TVM) is imported by the calls that use it
    from .compile.cards import ModelCard
    from .compile.config import CudaConfig, TuneRequest
    from .compile.int8.build import Int8Config
    from .compile.manifest import BuildResult
    from .compile.tensorrt_artifacts import TensorRTOptions
    from .compile.tune_bundle import TuneResult


def build(
    model: Path,
    profile_name: str,
    out: Path,
    card: ModelCard,
    progress: Callable[[str], None] = lambda s: None,
    twin: bool = False,
    **options: Any,
) -> BuildResult:
    """A bundle for either runtime (compile.build_options.build_for_runtime's options: runtime, batch,
    precision, cuda_graph, use_cache, int8, workspace_mib, cuda); `twin`: the profile's twin (compile/twin.py)."""
    from .compile.build_options import build_for_runtime

    profile = get_profile(profile_name)
    if twin:
        from .compile.twin import twin_profile

        if options.get("runtime", "tvm") != "tvm":
            raise InputError("a twin is a TVM build (--runtime tvm)")
        profile = twin_profile(profile)
    return build_for_runtime(model, profile, out, card, progress=progress, **options)


def tune(
    bundle: Path,
    request: TuneRequest,
    progress: Callable[[str], None] = lambda s: None,
    sources: Sequence[Path] = (),
    cuda: CudaConfig | None = None,
) -> TuneResult:
    """Tune the kernels of what `bundle` was built from (found in the build store, or `sources`); the
    database is applied by later builds. `cuda`: the CUDA schedule configuration (default: the default one)."""
    from .compile.config import CudaConfig
    from .compile.tune_bundle import tune_model

    with agent_input():
        return tune_model(bundle, request, progress, sources, cuda or CudaConfig())


def tune_request(bundle: Path, manifest: Manifest, *options: Any) -> TuneRequest:
    """`edgedeploy tune`'s options checked into a request (compile.tune_bundle.tune_request)."""
    from .compile.tune_bundle import tune_request as make_request

    return make_request(bundle, manifest, *options)


def import_tuning(folder: Path, database: Path | None = None) -> tuple[Path, int]:
    """Store the database that tune_offline wrote into `folder` (default: the user's database for the
    exported profile and model); returns where, and how many records it holds now."""
    from .compile.tuning.apply import import_database

    return import_database(folder, database)


def build_tensorrt(
    model: Path,
    profile_name: str,
    out: Path,
    card: ModelCard,
    int8: Int8Config,
    options: TensorRTOptions,
    progress: Callable[[str], None] = lambda s: None,
) -> BuildResult:
    """A TensorRT bundle: INT8 Q/DQ ONNX, shape profiles, builder settings, reference outputs; no engine."""
    from .compile.tensorrt_artifacts import build_tensorrt_bundle

    profile = get_profile(profile_name)
    return build_tensorrt_bundle(model, profile, out, card, int8, options, progress=progress)


def evaluate(
    target: Path,
    data: Path,
    card: ModelCard,
    split: str = "auto",
    limit: int | None = None,
    synsets: Path | None = None,
    sources: Sequence[Path] = (),
) -> dict[str, Any]:
    """Top-1/top-5 of a bundle (TVM library vs onnxruntime FP32 and the exact INT8 reference) or of an ONNX
    model. A bundle's source and QDQ model come from the build store, or `sources` (checked by sha256)."""
    from .build_store import check_given
    from .compile.int8.evaluate import evaluate_target

    if target.suffix != ".onnx":
        check_given(inspect_bundle(target), sources)  # before any image is scored
    elif sources:
        raise InputError("--source is for bundles; an ONNX model is evaluated as it is")
    return evaluate_target(target, data, card.preprocess, card.postprocess.label_offset, split, limit, synsets, sources)


def inspect_bundle(path: Path) -> Manifest:
    with agent_input():
        return read_manifest(path)


def plot_device_reports(device: str, reports: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    from .plot import plot_reports  # matplotlib only when a plot is asked for

    return plot_reports(device, reports, out)
