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


def test_annotations_evaluated_at_import_parse_on_python_3_9() -> None:
    """A device runs the agent on Python 3.9 (JetPack 5), where `X | Y` in an annotation that is evaluated when
    the module is imported raises TypeError; vermin does not see it (it reached the arm64 test once)."""
    import ast
    from pathlib import Path

    bad = []
    for f in sorted((Path(__file__).resolve().parents[2] / "agent").rglob("*.py")):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        if any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body):
            continue  # postponed: annotations stay strings
        for node in ast.walk(tree):
            annotations: list[ast.expr] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                annotations = [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs] if x.annotation]
                annotations += [node.returns] if node.returns else []
            elif isinstance(node, ast.AnnAssign):
                annotations = [node.annotation]
            bad += [
                f"{f.name}:{m.lineno}"
                for ann in annotations
                for m in ast.walk(ann)
                if isinstance(m, ast.BinOp) and isinstance(m.op, ast.BitOr)
            ]
    assert not bad, f"PEP 604 unions evaluated at import on Python 3.9: {bad}"
