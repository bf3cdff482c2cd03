"""Options shared by several commands, and the range check every numeric option goes through."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from edgedeploy_agent.names import SLOT_NAME_RULE, is_slot_name

from ..errors import BuildError, InputError

if TYPE_CHECKING:
    from ..compile.config import CudaConfig

KNOBS_ENV = "EDGEDEPLOY_CUDA_KNOBS"
TENSOR_CORES_ENV = "EDGEDEPLOY_CUDA_TENSOR_CORES"

N = TypeVar("N", int, float)


def in_range(
    low: float | None = None, high: float | None = None, low_open: bool = False
) -> Callable[[typer.Context, typer.CallbackParam, N | None], N | None]:
    """A typer callback that refuses, while the command line is parsed (before anything moves), a value
    below `low` (or equal to it when `low_open`), above `high`, NaN or infinite: one line, exit 2."""
    if low is not None and high is not None:
        wanted = f"between {low:g} and {high:g}" + (f" (not {low:g})" if low_open else "")
    elif low is not None:
        wanted = f"greater than {low:g}" if low_open else f"at least {low:g}"
    else:
        wanted = f"at most {high:g}"

    def check(ctx: typer.Context, param: typer.CallbackParam, value: N | None) -> N | None:
        if value is None:
            return None
        below = low is not None and (value < low or (low_open and value == low))
        if not math.isfinite(value) or below or (high is not None and value > high):
            raise InputError(f"{param.opts[0]} must be {wanted}, got {value}", hint=f"see {ctx.command_path} --help")
        return value

    return check


POSITIVE = in_range(0, low_open=True)


def bundle_path(out: Path) -> Path:
    """Refuse an -o the bundle cannot be written to, before any work is done."""
    if out.is_dir():
        raise InputError(f"-o {out} is a folder", hint=f"name the bundle file, e.g. {out / 'model.edb'}")
    folder = out.parent
    while not folder.exists():  # missing folders are created when the bundle is written
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"-o {out}: {folder} is a file, not a folder", hint="choose another bundle path")
    if not os.access(folder, os.W_OK | os.X_OK) or not _can_create_in(folder):
        raise InputError(f"-o {out}: cannot write into {folder}", hint="choose a folder you can write to")
    return out


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder` (root passes os.access where the file system refuses: /proc)."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".edgedeploy-probe-"):
            return True
    except OSError:
        return False


InventoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        "-i",
        envvar="EDGEDEPLOY_INVENTORY",
        help="devices TOML (default: devices.toml in the user config folder)",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON for scripts")]


def _model_name(ctx: typer.Context, param: typer.CallbackParam, value: str) -> str:
    if not is_slot_name(value):
        raise InputError(
            f"--model {value[:40]!r} is not a model name ({SLOT_NAME_RULE})", hint=f"see {ctx.command_path} --help"
        )
    return value


ModelOpt = Annotated[
    str,
    typer.Option(
        "--model", help="which of the device's models (model slot; `default` unless named)", callback=_model_name
    ),
]


def _model_filter(ctx: typer.Context, param: typer.CallbackParam, value: str | None) -> str | None:
    return None if value is None else _model_name(ctx, param, value)


ModelFilterOpt = Annotated[
    str | None,
    typer.Option("--model", help="only this model of each device (model slot; every model unless named)",
                 callback=_model_filter),
]  # fmt: skip
SourceOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--source",
        help="a file the bundle was built from (source or Q/DQ model) when the build store lacks it; "
        "checked by sha256, then stored again (repeatable)",
    ),
]

# health objectives checked on the device after activation (any miss rolls the device back)
TimeoutOpt = Annotated[float, typer.Option(help="seconds to wait for the agent to report healthy", callback=POSITIVE)]
MinInferencesOpt = Annotated[
    int,
    typer.Option(
        "--min-inferences", help="successful inferences required after ready (0: ready is enough)", callback=in_range(0)
    ),
]
MaxP95Opt = Annotated[
    float | None, typer.Option("--max-p95-ms", help="health objective: inference p95 latency", callback=POSITIVE)
]
MinFpsOpt = Annotated[
    float | None, typer.Option("--min-fps", help="health objective: frames per second", callback=POSITIVE)
]
ConnectTimeoutOpt = Annotated[
    float, typer.Option("--connect-timeout", help="seconds to wait for SSH to connect", callback=POSITIVE)
]
IoTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--io-timeout",
        help="seconds an upload may stall before it is given up (it resumes later)",
        callback=POSITIVE,
    ),
]


def cuda_config_from_env() -> CudaConfig:
    """The CUDA schedule configuration of a GPU build, for before/after measurements of one change: the knobs
    in EDGEDEPLOY_CUDA_KNOBS ("async_stages=3,int8_k=32"), and EDGEDEPLOY_CUDA_TENSOR_CORES=0 for the kernels
    edgedeploy had before tensor cores. The only place that reads them: compile/ is handed the result."""
    from ..compile.config import CudaConfig, Knobs

    try:
        knobs = Knobs.parse(os.environ.get(KNOBS_ENV, "").strip(), KNOBS_ENV)
    except ValueError as e:
        raise BuildError(str(e), hint=f"unset {KNOBS_ENV} for the default schedules") from None
    return CudaConfig(knobs, os.environ.get(TENSOR_CORES_ENV, "1") != "0")
