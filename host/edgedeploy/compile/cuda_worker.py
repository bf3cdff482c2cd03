"""Runs a CUDA compile pipeline in its own process: `python -m edgedeploy.compile.cuda_worker REQ.json`.

Why a process: the CUDA toolchain is process environment (LD_LIBRARY_PATH for the stub driver and
the CUDA runtime, TVM_CUDA_COMPILE_MODE, CUDA_PATH) and must be in place before `tvm` is imported.
Protocol on stdout: `stage NAME` lines, then one `result {json}` or `error {json}` line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import BuildError, EdgeDeployError
from ..profiles import DeviceProfile
from .compiled import Compiled
from .config import CudaConfig, TuneRequest
from .cuda.toolchain import CudaToolchain
from .frontends.onnx_model import OnnxModel


def run_cuda_build(
    model: OnnxModel,
    profile: DeviceProfile,
    work: Path,
    toolchain: CudaToolchain,
    precision: str,
    cuda_graph: bool,
    cuda: CudaConfig,
    tuning_key: str,
    tuning_db: Path | None,
    tune: TuneRequest | None,
    progress: Callable[[str], None],
) -> Compiled:
    request = work / "cuda-request.json"
    request.write_text(
        json.dumps(
            {
                "model": str(model.path),
                "profile": profile.model_dump(mode="json"),
                "work": str(work),
                "precision": precision,
                "cuda_graph": cuda_graph,
                "cuda": cuda.to_json(),
                "batch": model.inputs[0].shape[0],
                "tuning_key": tuning_key,
                "tuning_db": str(tuning_db) if tuning_db else None,
                "tune": tune.to_json() if tune else None,
            }
        )
    )
    env = {**os.environ, **toolchain.env}
    outcome: dict[str, Any] | None = None  # the worker's error
    compiled: Compiled | None = None
    log = work / "cuda-worker.log"  # stderr to a file: a full pipe must never stall the worker
    with (
        open(log, "w") as err,
        subprocess.Popen(
            [sys.executable, "-m", "edgedeploy.compile.cuda_worker", str(request)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            word, _, rest = line.rstrip("\n").partition(" ")
            if word == "stage":
                progress(rest)
            elif word == "result":
                compiled = Compiled.from_json(rest)
            elif word == "error":
                outcome = json.loads(rest)
    if compiled is not None:
        return compiled
    stderr = log.read_text(errors="replace")
    if outcome is None:
        tail = [ln for ln in stderr.splitlines() if ln.strip()][-1:] or ["no output"]
        raise BuildError(f"CUDA build worker died (exit {proc.returncode}): {tail[0]}")
    raise BuildError(outcome["message"], hint=outcome.get("hint"))


def main(request_path: str) -> int:
    from .frontends.onnx_model import load_onnx
    from .pipeline import run_pipeline
    from .stage import BuildContext

    req = json.loads(Path(request_path).read_text())
    try:
        ctx = run_pipeline(
            BuildContext(
                model=load_onnx(Path(req["model"]), batch=req["batch"]),
                profile=DeviceProfile.model_validate(req["profile"]),
                work_dir=Path(req["work"]),
                progress=lambda s: print(f"stage {s}", flush=True),
                precision=req["precision"],
                cuda_graph=req["cuda_graph"],
                cuda=CudaConfig.from_json(req["cuda"]),
                tuning_key=req["tuning_key"],
                tuning_db=Path(req["tuning_db"]) if req["tuning_db"] else None,
                tune=TuneRequest.from_json(req["tune"]) if req["tune"] else None,
            )
        )
    except EdgeDeployError as e:
        print("error " + json.dumps({"message": e.message, "hint": e.hint}), flush=True)
        return 1
    print("result " + Compiled.of(ctx).to_json(), flush=True)
    return 0


if __name__ == "__main__":
    from edgedeploy_agent import tvm_without_torch

    tvm_without_torch.install()
    sys.exit(main(sys.argv[1]))
