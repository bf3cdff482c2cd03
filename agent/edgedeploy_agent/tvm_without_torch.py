"""Import TVM without the PyTorch it imports whenever PyTorch is installed.

apache-tvm-ffi 0.1.14's package `__init__` runs `import torch` if it can (a workaround for a symbol clash seen
on Windows; its `_convert` and `stream` modules do the same), and apache-tvm 0.27's `tvm.relax.base_py_module`,
which `import tvm` loads, imports `torch.utils.dlpack` for Relax modules with Python functions. edgedeploy hands
TVM NumPy arrays and DLPack capsules, never torch tensors, and has no such modules: in a process that has not
imported torch itself the import is pure cost. Measured on the project's 2-core development machine with the
dev venv (torch 2.13): `import tvm` 5.7-6.8 s, 2.4 s with torch hidden; with a test run beside it, `edgedeploy
build` of the MNIST model for cpu-x86_64 10.9-11.7 s, 4.7-5.0 s (every `inspect` scan of `sys.modules` while
TVMScript is parsed is also shorter: compile/cuda/tensor_intrinsics.py). A Jetson's agent has no torch; on a
development host torch was 2.3 s of `import tvm_ffi` (`python -X importtime`), which the agent now skips, with
torch's memory.

`install()` puts a finder first on `sys.meta_path` that changes only how the packages `tvm_ffi` and `tvm` are
executed on their first import: while their `__init__` (and all it imports) runs, `sys.modules["torch"]` is
None, so each `import torch` in them raises ImportError, as where torch is not installed; afterwards torch
imports normally (the PyTorch frontend, the bench's peer). What TVM then lacks: conversion of a `torch.dtype`
argument, torch stream contexts and the faster torch DLPack path of `BasePyModule`, none of which edgedeploy
uses. If torch was imported first, nothing is hidden. The entry points install it: the host CLI, the CUDA
build worker, the GEMM search's spawned builders (their pool's initializer), the agent, the tests. TVM's own
worker processes (`python -m tvm.exec.popen_worker`: MetaSchedule's builders and runners, the RPC tracker's
and server's) start without it and import torch as before.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

PACKAGES = ("tvm_ffi", "tvm")


class _WithoutTorch(importlib.machinery.SourceFileLoader):
    """Runs the package with `import torch` failing (_Finder gives it only where torch is not imported)."""

    def exec_module(self, module: ModuleType) -> None:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
        try:
            super().exec_module(module)
        finally:
            del sys.modules["torch"]


class _Finder(importlib.abc.MetaPathFinder):
    """Finds PACKAGES where the path finder does, with a loader that hides torch while they run."""

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name not in PACKAGES or "torch" in sys.modules:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader:
            return spec  # not installed, or installed some other way: as the path finder has it
        spec.loader = _WithoutTorch(spec.loader.name, spec.loader.path)
        return spec


def install() -> None:
    """From now on, a first import of tvm_ffi or tvm in this process does not import torch (once is enough)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
