"""Counts tensor-core and dot-product instructions in the SASS of GPU bundles (build host, no GPU):

    .venv/bin/python bench/tc_sass.py B.edb [...]   ->  one JSON line per bundle

HMMA: FP16 tensor cores; IMMA: INT8 tensor cores; IDP.4A: dp4a; FFMA: float32 FMA; kernels: functions.

    .venv/bin/python bench/tc_sass.py --diff A.edb B.edb   ->  the kernels whose SASS differs, one per line

compares two bundles function by function (instructions only: addresses and encodings dropped), e.g. to
show that a change touched only the kernels it meant to (docs/benchmarks.md, run18).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from edgedeploy.compile.cuda.devcode import device_blobs
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


def sass_functions(lib: Path) -> dict[str, list[str]]:
    """Kernel name -> its SASS instructions, for every kernel of a library's device code."""
    exe = cuobjdump()
    functions: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, blob) in enumerate(device_blobs(lib.read_bytes())):
            f = Path(tmp) / f"dev{i}.{kind}"
            f.write_bytes(blob)
            env = {**os.environ, "NVDISASM_PATH": str(exe.parent)}
            sass = subprocess.run([str(exe), "--dump-sass", str(f)], capture_output=True, text=True, env=env).stdout
            for fn in sass.split("Function : ")[1:]:
                name, _, body = fn.partition("\n")
                # "/*0070*/  IMAD R1, ... ;  /* 0x... */": the instruction between the address and the ';'
                functions[name.strip()] = [
                    ln.split("*/", 1)[-1].split(";")[0].strip() for ln in body.splitlines() if ";" in ln
                ]
    return functions


def sass_counts(lib: Path) -> dict[str, int]:
    counts = dict.fromkeys(OPS, 0) | {"kernels": 0, "tensor_core_kernels": 0}
    for lines in sass_functions(lib).values():
        counts["kernels"] += 1
        per = {op: sum(1 for ln in lines if f" {op}" in f" {ln}") for op in OPS}
        counts["tensor_core_kernels"] += bool(per["HMMA"] or per["IMMA"])
        for op in OPS:
            counts[op] += per[op]
    return counts


def _library(bundle: Path, tmp: str) -> Path:
    extract_bundle(bundle, Path(tmp) / bundle.stem)
    return Path(tmp) / bundle.stem / "model.so"


def main() -> None:
    if sys.argv[1:2] == ["--diff"] and len(sys.argv) == 4:
        with tempfile.TemporaryDirectory() as tmp:
            a, b = (sass_functions(_library(Path(p), tmp)) for p in sys.argv[2:4])
        differ = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
        for n in differ:
            where = "differs" if n in a and n in b else f"only in {sys.argv[2] if n in a else sys.argv[3]}"
            print(f"{where}: {n}")
        print(f"{sum(1 for n in a if b.get(n) == a[n])} kernels identical, {len(differ)} not")
        return
    for arg in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps({"bundle": Path(arg).name, **sass_counts(_library(Path(arg), tmp))}), flush=True)


if __name__ == "__main__":
    main()
