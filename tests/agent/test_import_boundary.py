"""The agent imports no compiler, SSH library, CLI framework or host code (ruff's banned-api rule
enforces it statically in agent/ruff.toml; this checks it at run time, module by module)."""

import subprocess
import sys

FORBIDDEN = ["tvm", "paramiko", "fabric", "typer", "click", "rich", "onnx", "onnxruntime", "edgedeploy"]

SCRIPT = f"""
import importlib, pkgutil, sys
import edgedeploy_agent
for m in pkgutil.walk_packages(edgedeploy_agent.__path__, "edgedeploy_agent."):
    if not m.name.endswith("__main__"):
        importlib.import_module(m.name)
from edgedeploy_agent.runtime import tvm  # the lazily imported backend too
bad = sorted(n for n in sys.modules if n.split(".")[0] in {FORBIDDEN!r})
print(",".join(bad))
"""


def test_agent_modules_import_nothing_forbidden() -> None:
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ""
