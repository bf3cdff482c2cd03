"""The agent runs bundles with the TVM runtime alone: the `tvm` package cannot be imported and the
compiler library is not on the runtime path. The agent's own report lists the TVM libraries mapped
into its process, and libtvm_compiler.so is not among them."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import BIN

pytestmark = pytest.mark.integration

BLOCKER = """
import sys
class _NoCompiler:
    def find_spec(self, name, path=None, target=None):
        if name == "tvm" or name.startswith("tvm."):
            raise ImportError("blocked for this test: the agent must not import " + name)
        return None
sys.meta_path.insert(0, _NoCompiler())
"""


def test_agent_loads_and_runs_without_the_compiler(tmp_path: Path, mnist_bundle: Path, mnist_video) -> None:
    spec = importlib.util.find_spec("tvm")
    assert spec and spec.submodule_search_locations
    kit = tmp_path / "kit"
    kit.mkdir()
    shutil.copy2(Path(spec.submodule_search_locations[0]) / "lib" / "libtvm_runtime.so", kit)
    assert not list(kit.glob("libtvm_compiler*"))
    block = tmp_path / "block"
    block.mkdir()
    (block / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(block)}
    root = tmp_path / "root"

    def agent(*args: str) -> dict:
        p = subprocess.run(
            [str(BIN / "edgedeploy-agent"), "--root", str(root), "--json", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        return json.loads(p.stdout.splitlines()[-1])

    # the blocker really blocks: importing tvm in that environment fails
    probe = subprocess.run([sys.executable, "-c", "import tvm"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "blocked for this test" in probe.stderr

    assert agent(
        "init",
        "--service",
        "process",
        "--tvm-runtime-lib",
        str(kit / "libtvm_runtime.so"),
        "--source",
        f"file:{mnist_video.path}",
    )["ok"]
    staged = root / "incoming" / "b.edb"
    shutil.copy(mnist_bundle, staged)
    res = agent("deploy", str(staged), "--timeout", "60")
    try:
        assert res["ok"], res
        runtime = res["health"]["runtime"]
        assert runtime["runtime_lib"] == str(kit / "libtvm_runtime.so")
        assert "libtvm_runtime.so" in runtime["loaded_tvm_libraries"]
        assert not [lib for lib in runtime["loaded_tvm_libraries"] if "compiler" in lib]
    finally:
        agent("stop")
