"""The key that names a model's tuning databases: its graph (weights left out) and precision."""

from __future__ import annotations

from typing import Protocol


class _Keyed(Protocol):
    @property
    def sha256(self) -> str: ...  # the file's

    @property
    def graph_sha256(self) -> str: ...


def tuning_key(model: _Keyed, precision: str) -> str:
    return f"{model.graph_sha256[:16]}-{precision}"
