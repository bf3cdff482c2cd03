"""Fixtures of the host tests: the optional frontends (tests/host/frontends.py)."""

from __future__ import annotations

import pytest

from tests.host.frontends import LITERT, TFLITE, TORCH, require_frontend


@pytest.fixture
def tflite_installed() -> None:
    require_frontend(*TFLITE)


@pytest.fixture
def litert_installed() -> None:
    require_frontend(*LITERT)


@pytest.fixture
def torch_installed() -> None:
    require_frontend(*TORCH)
