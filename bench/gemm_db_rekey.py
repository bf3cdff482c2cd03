"""Convert a GEMM tuning database (gemm_configs.json) of version 1 to the current kernel keys.

Version 1 named each kernel by the structural hash of its TIR with its floating-point constants in it, so
a kernel whose per-tensor dequantize scale changed (another calibration, or the same model exported on
another CPU) was a new kernel and its tuned configuration was lost. `cuda_tensorcore.kernel_key` now sets
those constants to 0 (gemm_tuning.VERSION 2). The old keys cannot be turned into the new ones without the
kernels, so this takes the kernels from `edgedeploy tune BUNDLE --export DIR` folders:

    python bench/gemm_db_rekey.py OLD/gemm_configs.json NEW/gemm_configs.json DIR [DIR ...]

An old entry is matched to a kernel of DIR by its old key (the kernel's TIR is the same), or, for a kernel
no old key matches, by its name with the operator numbers left out and its GEMM shape (a twin: the same
kernel with other constants); where several entries match one new key, the most recently searched wins.
Entries that match no kernel are dropped (reported); kernels with no entry are listed. Needs tvm (the
compiler) and edgedeploy.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any


def legacy_key(func: Any) -> str:
    """Version 1's kernel_key: the structural hash with attributes dropped, constants included."""
    import tvm_ffi

    for name in list((func.attrs or {}).keys()):
        func = func.without_attr(name)
    return f"{tvm_ffi.structural_hash(func) & (2**64 - 1):016x}"


def twin(name: str, shape: str) -> tuple[str, str]:
    return re.sub(r"\d+", "", name), shape


def _named(entry: dict[str, Any]) -> tuple[str, str]:
    return str(entry.get("name", "")), str(entry.get("shape", ""))


def kernels(folder: Path) -> list[tuple[str, str, Any]]:
    """(new key, old key, GemmKernel) of every tensor-core kernel of an exported tuning module."""
    import tvm

    from edgedeploy.compile.tuning.gemm import gemm_kernels

    meta = json.loads((folder / "tuning.json").read_text())
    mod = tvm.ir.load_json((folder / "tuning-module.json").read_text())
    target = tvm.target.Target(meta["target"])
    out = []
    for gv, f in mod.functions.items():  # each function on its own: twins merged by gemm_kernels
        if not isinstance(f, tvm.tirx.PrimFunc):
            continue
        for k in gemm_kernels(tvm.IRModule({gv: f}), target):
            out.append((k.key, legacy_key(f), k))
    return out


def rekey(old: dict[str, Any], found: list[tuple[str, str, Any]]) -> tuple[dict[str, Any], list[str], list[str]]:
    """The version-2 document, the old keys dropped, the new keys that got no entry."""
    from edgedeploy.compile.tuning.gemm import VERSION

    entries = old.get("kernels", {})
    chosen: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for new_key, old_key, k in found:
        same = twin(k.name, k.shape)
        matches = [old_key] if old_key in entries else [key for key, e in entries.items() if twin(*_named(e)) == same]
        for key in matches:
            used.add(key)
            e = entries[key]
            if new_key not in chosen or e.get("updated", 0) > chosen[new_key].get("updated", 0):
                chosen[new_key] = e
    doc = {k: v for k, v in old.items() if k != "kernels"}
    doc["version"] = VERSION
    doc["kernels"] = dict(sorted(chosen.items()))
    missing = sorted({new_key for new_key, _, _ in found} - set(chosen))
    return doc, sorted(set(entries) - used), missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("exports", type=Path, nargs="+")
    args = ap.parse_args()
    old = json.loads(args.old.read_text())
    if old.get("version", 1) != 1:
        print(f"error: {args.old} is version {old.get('version')}, not 1", file=sys.stderr)
        return 2
    found = [row for folder in args.exports for row in kernels(folder)]
    doc, dropped, missing = rekey(old, found)
    args.new.parent.mkdir(parents=True, exist_ok=True)
    args.new.write_text(json.dumps(doc, indent=1) + "\n")
    tuned = sum(1 for e in doc["kernels"].values() if e.get("best"))
    print(f"{args.new}: {len(doc['kernels'])} kernels ({tuned} with a kept configuration), {len(found)} in the modules")
    for key in dropped:
        print(f"  dropped {key} {entries_name(old, key)}")
    for key in missing:
        print(f"  no entry for {key}")
    return 0


def entries_name(doc: dict[str, Any], key: str) -> str:
    e = doc["kernels"][key]
    return f"{e.get('name', '?')[:70]} ({e.get('shape', '?')})"


if __name__ == "__main__":
    sys.exit(main())
