"""TVM imported without PyTorch (agent/edgedeploy_agent/tvm_without_torch.py): each case runs in a fresh
interpreter of the dev venv, where torch is installed, since the import is once per process."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

from tests.helpers import require

require("DEV_PACKAGES", None if importlib.util.find_spec("torch") else "torch is not installed (pip install '.[dev]')")


def _python(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_tvm_imports_torch_by_itself() -> None:
    """The upstream behaviour the module works around; when this fails, TVM stopped and the module can go."""
    assert _python("import sys, tvm; print('torch' in sys.modules)") == "True"


def test_installed_tvm_imports_without_torch_and_torch_still_works_after() -> None:
    out = _python("""
        import sys
        from edgedeploy_agent import tvm_without_torch
        tvm_without_torch.install()
        tvm_without_torch.install()
        import numpy as np, tvm, tvm_ffi
        print('torch' in sys.modules, sum(type(f).__name__ == '_Finder' for f in sys.meta_path))
        a = tvm.runtime.tensor(np.arange(4, dtype='float32'))
        import torch  # afterwards torch imports normally, and its tensors reach TVM through DLPack
        t = tvm_ffi.from_dlpack(torch.arange(4, dtype=torch.float32))
        print(a.numpy().tolist() == t.numpy().tolist() == [0.0, 1.0, 2.0, 3.0])
    """)
    assert out.splitlines() == ["False 1", "True"]


def test_torch_imported_first_is_left_alone() -> None:
    out = _python("""
        from edgedeploy_agent import tvm_without_torch
        tvm_without_torch.install()
        import torch, tvm_ffi._convert
        print(tvm_ffi._convert.torch is torch)
    """)
    assert out == "True"


def test_the_entry_points_install_it() -> None:
    """The host CLI's and the agent's main(): a TVM imported after them comes without torch."""
    for main in ("edgedeploy.cli.main", "edgedeploy_agent.cli"):
        out = _python(f"""
            import contextlib, io, sys
            from {main} import main
            sys.argv = ["x", "--version"]
            with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
                main()
            import tvm_ffi
            print('torch' in sys.modules)
        """)
        assert out == "False", main
