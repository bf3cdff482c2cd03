"""What `edgedeploy tune` asks of the apply-tuning stage, and the key that names a model's tuning databases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class TuneRequest:
    """What `edgedeploy tune` asks of the apply-tuning stage."""

    trials: int
    database: Path | None  # read and extended; None: the user's, for the model's key (tune_model decides)
    runner: str = "local"  # local | rpc | export
    tracker: str = ""  # rpc: HOST:PORT of TVM's RPC tracker
    key: str = ""  # rpc: the device key the RPC servers registered with
    export_dir: Path | None = None
    cost_model: str = "xgb"  # xgb | random
    tasks: int = 0  # > 0: only N kernels (costliest by measured time here, else heaviest by FLOPs x calls)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "database": str(self.db), "export_dir": str(self.export_dir or "")}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TuneRequest:
        return cls(
            **{**d, "database": Path(d["database"]), "export_dir": Path(d["export_dir"]) if d["export_dir"] else None}
        )

    @property
    def db(self) -> Path:
        if self.database is None:
            raise AssertionError("TuneRequest.database is decided by tune_model before any tuning")
        return self.database


class _Keyed(Protocol):
    @property
    def sha256(self) -> str: ...  # the file's

    @property
    def graph_sha256(self) -> str: ...


def tuning_key(model: _Keyed, precision: str) -> str:
    return f"{model.graph_sha256[:16]}-{precision}"
