"""The optional frontends and reference runtimes host tests need, through the one require() rule: CI (.ci/run)
sets EDGEDEPLOY_REQUIRE_FRONTENDS=1 (make's .[dev] installs them), elsewhere a missing one skips with its reason.
The fixtures themselves live in tests/host/conftest.py; a test asks for one with these marks."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import require

TFLITE = ("tflite", "tflite (TVM's TFLite frontend reads its schema)")
LITERT = ("ai_edge_litert", "ai-edge-litert (the TFLite interpreter): pip install 'edgedeploy[litert]'")
TORCH = ("torch", "torch: pip install 'edgedeploy[torch]'")

needs_tflite = pytest.mark.usefixtures("tflite_installed")
needs_litert = pytest.mark.usefixtures("litert_installed")
needs_torch = pytest.mark.usefixtures("torch_installed")


def require_frontend(module: str, what: str) -> None:
    require("FRONTENDS", None if importlib.util.find_spec(module) else f"{what} is not installed")
