"""The first commands a newcomer types start without the host's heavy libraries: no compiler, model format,
array library, SSH or MQTT client, or crypto is imported by --help, --version, `profiles list` or `status` on a
machine with no devices (cli/__init__.py says how; bench/startup.py times them). Checked at run time, each in a
fresh interpreter through the console script's entry point."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = {
    "onnx", "onnxruntime", "ml_dtypes", "tvm", "tvm_ffi", "torch", "tflite", "numpy", "cv2",
    "matplotlib", "paramiko", "paho", "cryptography",
}  # fmt: skip

SCRIPT = f"""
import json, sys
from edgedeploy.cli.main import main
sys.argv = ["edgedeploy", *sys.argv[1:]]
code = 0
try:
    main()
except SystemExit as e:
    code = e.code
print(json.dumps({{"exit": code, "heavy": sorted({{n.split(".")[0] for n in sys.modules}} & {HEAVY!r})}}))
"""


@pytest.mark.parametrize(
    ("command", "exit_code"),
    [
        pytest.param(command, exit_code, id=" ".join(command))
        for command, exit_code in [(["--help"], 0), (["--version"], 0), (["profiles", "list"], 0), (["status"], 2)]
    ],  # status: no devices yet, one line and exit 2
)
def test_first_commands_import_no_heavy_library(command: list[str], exit_code: int) -> None:
    p = subprocess.run([sys.executable, "-c", SCRIPT, *command], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout.splitlines()[-1])
    assert result == {"exit": exit_code, "heavy": []}, p.stdout + p.stderr
