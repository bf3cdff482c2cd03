"""TVM's tensor intrinsics (`tvm.s_tir.tensor_intrin`: WMMA, mma/ldmatrix, dp4a, ...), imported in seconds.

Importing `tvm.s_tir.tensor_intrin` parses about 250 TVMScript functions. TVM 0.27's `T.prim_func` calls
`inspect.stack()` for each one, and the standard library resolves the module of every frame on the stack
with `inspect.getmodule`. Its file-to-module cache never learns a name that is no real file, so for every
frame of `<frozen importlib._bootstrap>` (several per level of the import that got us here) and of `<ast>`
(TVMScript's own evaluated code) it scans all of `sys.modules` again: 2,000 modules once tvm_ffi has
imported torch (edgedeploy's entry points now keep torch out, agent/edgedeploy_agent/tvm_without_torch.py,
but TVM's own worker processes still import it, and a user's script may have). Measured on the project's
2-core build host: `import tvm.s_tir.tensor_intrin.cuda` took 72 s from a script and 107 s under a build's
import chain; the CUDA build of the 26 KB MNIST model for `t4` took 5.3 minutes, almost all of it here, in the
host process and again in the CUDA worker, which is what pushed CI past its 90 minutes. With the cache seeded
below: 9 s.

Every process that needs them goes through `import_all`: builds (cuda_tensorcore, cuda_mma), MetaSchedule
databases, and MetaSchedule's builder processes (metaschedule.build_in_target: TVM's default_build imports
the package itself, and its 60-100 s there had passed the builder's timeout under load).

The seed maps those names to a module name that does not exist, which is exactly what the scan concludes
for them (`getmodule` returns None either way); only the time changes.
"""

from __future__ import annotations

import inspect
from types import ModuleType

# filenames of frames that are no file on disk and no module (checked before seeding: the scan says None)
_NOT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<ast>")
_NO_MODULE = "<edgedeploy: no module>"


def seed_inspect_cache() -> None:
    """Teach `inspect.getmodule` what its scan of sys.modules would find for `_NOT_FILES`: nothing."""
    probe = compile("0", "<probe>", "eval")  # an object without __module__, as a frame's code is
    for name in _NOT_FILES:
        if name not in inspect.modulesbyfile and inspect.getmodule(probe, name) is None:
            inspect.modulesbyfile[name] = _NO_MODULE


def import_all() -> ModuleType:
    """`tvm.s_tir.tensor_intrin` with every tensor intrinsic of TVM registered (its `__init__` imports them
    all: `.cuda` holds the CUDA generators; MetaSchedule databases may name any of them)."""
    import importlib

    seed_inspect_cache()
    return importlib.import_module("tvm.s_tir.tensor_intrin")
