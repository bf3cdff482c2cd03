"""Counts tensor-core and dot-product instructions in the SASS of GPU bundles (build host, no GPU):

    .venv/bin/python bench/tc_sass.py B.edb [...]   ->  one JSON line per bundle

HMMA: FP16 tensor cores; IMMA: INT8 tensor cores; IDP.4A: dp4a; FFMA: float32 FMA; kernels: functions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from edgedeploy.compile.devcode import device_blobs
from edgedeploy_agent.bundle import extract_bundle

OPS = ("HMMA", "IMMA", "IDP.4A", "FFMA")


def cuobjdump() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        exe = Path(root) / "cu13" / "bin" / "cuobjdump"
        if exe.is_file():
            for tool in ("cuobjdump", "nvdisasm"):
                if (exe.parent / tool).exists():
                    (exe.parent / tool).chmod(0o755)
            return exe
    raise SystemExit("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")


def sass_counts(lib: Path) -> dict[str, int]:
    exe = cuobjdump()
    counts = dict.fromkeys(OPS, 0) | {"kernels": 0, "tensor_core_kernels": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, blob) in enumerate(device_blobs(lib.read_bytes())):
            f = Path(tmp) / f"dev{i}.{kind}"
            f.write_bytes(blob)
            env = {**os.environ, "NVDISASM_PATH": str(exe.parent)}
            sass = subprocess.run([str(exe), "--dump-sass", str(f)], capture_output=True, text=True, env=env).stdout
            for fn in sass.split("Function : ")[1:]:
                counts["kernels"] += 1
                lines = fn.splitlines()
                per = {op: sum(1 for ln in lines if f" {op}" in ln) for op in OPS}
                counts["tensor_core_kernels"] += bool(per["HMMA"] or per["IMMA"])
                for op in OPS:
                    counts[op] += per[op]
    return counts


def main() -> None:
    for arg in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            extract_bundle(Path(arg), Path(tmp) / "rel")
            print(json.dumps({"bundle": Path(arg).name, **sass_counts(Path(tmp) / "rel" / "model.so")}), flush=True)


if __name__ == "__main__":
    main()
