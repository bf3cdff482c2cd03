"""THE report format: what a device spools and the host pulls (one JSON object per line)."""

import datetime as _dt
from typing import Any, Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

REPORT_SCHEMA_VERSION = 1
STAGES = ("capture", "preprocess", "infer", "postprocess")


class StageLatency(BaseModel):
    model_config = ConfigDict(extra="forbid")

    p50: float
    p95: float
    p99: float
    mean: float
    max: float


class Prediction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    frame: int = Field(description="frame index in the source since the agent started")
    top: list[list[Any]] = Field(description="[[class_index, label, score], ...] best first")


class PowerReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: Literal["measured", "unavailable"]
    reason: Optional[str] = None
    sensor: Optional[str] = None
    mean_watts: Optional[float] = None
    energy_per_inference_mj: Optional[float] = None


class Report(BaseModel):
    """One measurement window of the inference loop."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = REPORT_SCHEMA_VERSION
    device: str
    seq: int
    bundle_id: str
    model: str
    model_version: str
    runtime: str
    source: str
    window_start: _dt.datetime
    window_end: _dt.datetime
    frames: int
    fps: float
    latency_ms: dict[str, StageLatency]
    predictions: list[Prediction] = Field(default_factory=list)
    power: PowerReport
    final: bool = Field(default=False, description="the source ended after this window")


def stage_latency(samples_ms: list[float]) -> StageLatency:
    a = np.asarray(samples_ms, dtype=np.float64)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return StageLatency(
        p50=round(float(p50), 4),
        p95=round(float(p95), 4),
        p99=round(float(p99), 4),
        mean=round(float(a.mean()), 4),
        max=round(float(a.max()), 4),
    )
