"""THE report format: what a device spools and the host pulls (one JSON object per line).

The host reads reports without NumPy: only the functions that compute them from samples import it."""

import datetime as _dt
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

# 2: a source of a multi-source agent reports the `batch_wait` stage, `batch` and `frame_latency_ms` (all optional:
# a version 1 report still reads); 3: `model_gpu_ms` (optional)
REPORT_SCHEMA_VERSION = 3
STAGES = ("capture", "preprocess", "infer", "postprocess")
# a source of a multi-source agent (batcher.py): its frame waits in a batch for the other sources' frames
BATCH_STAGES = ("capture", "batch_wait", "preprocess", "infer", "postprocess")
# Fixed log-spaced latency buckets (1 us .. 10 s, 8 per decade) so the host can add windows together.
HIST_EDGES_MS = [round(10 ** (e / 8), 6) for e in range(-24, 33)]


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
    energy_source: Optional[Literal["counter", "samples"]] = Field(
        default=None, description="an energy counter read at the window edges, or integrated power samples"
    )
    window_s: Optional[float] = None
    samples: Optional[int] = Field(default=None, description="power samples inside the window (samples only)")
    idle_watts: Optional[float] = Field(default=None, description="idle baseline measured before serving")
    dynamic_energy_per_inference_mj: Optional[float] = Field(
        default=None, description="energy per inference above the idle baseline"
    )
    rails_watts: Optional[dict[str, float]] = Field(default=None, description="last reading per rail")


class BatchReport(BaseModel):
    """How a multi-source agent's batches served this source in the window (batcher.py)."""

    model_config = ConfigDict(extra="forbid")

    size: int = Field(description="the bundle's compiled batch: frames one inference call takes")
    sources: int = Field(description="sources the agent serves, sharing its batches")
    max_wait_ms: float = Field(description="how long a batch waited for more sources' frames (the agent config)")
    mean_fill: float = Field(
        description="mean real frames in the calls this source's frames were in (the rest padding)"
    )
    aggregate_fps: float = Field(description="frames of all sources per second of the window")


class Report(BaseModel):
    """One measurement window of the inference loop."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = REPORT_SCHEMA_VERSION
    device: str
    slot: str = Field(default="default", description="the model slot on the device (`push --model`)")
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
    camera_up: Optional[bool] = Field(default=None, description="the source delivered fresh frames at window end")
    reconnects: Optional[int] = Field(default=None, description="times the source was lost and reopened")
    dropped_frames: Optional[int] = Field(default=None, description="live frames replaced before they were used")
    frame_age_ms: Optional[StageLatency] = Field(default=None, description="capture-to-inference age of frames")
    temperatures_c: Optional[dict[str, float]] = Field(default=None, description="thermal zones at window end")
    spool_dropped: Optional[int] = Field(default=None, description="oldest reports deleted to respect the disk cap")
    latency_hist: Optional[dict[str, list[int]]] = Field(
        default=None,
        description="per stage: frame counts in the HIST_EDGES_MS buckets, plus one below and one above",
    )
    frame_latency_ms: Optional[StageLatency] = Field(
        default=None, description="from a frame's capture to its prediction (schema 2)"
    )
    batch: Optional[BatchReport] = Field(
        default=None, description="multi-source: the shared batches; fps is then frames per window second (schema 2)"
    )
    model_gpu_ms: Optional[StageLatency] = Field(
        default=None,
        description="GPU bundles: the model's own GPU time, from CUDA events on a sample of the frames (the infer "
        "stage, on the host's clock, also has the top k and the wait; and the input's load still running where the "
        "runtime has no preprocessed_mark; schema 3)",
    )


def stage_latency(samples_ms: list[float]) -> StageLatency:
    import numpy as np

    a = np.asarray(samples_ms, dtype=np.float64)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return StageLatency(
        p50=round(float(p50), 4),
        p95=round(float(p95), 4),
        p99=round(float(p99), 4),
        mean=round(float(a.mean()), 4),
        max=round(float(a.max()), 4),
    )


def latency_histogram(samples_ms: list[float]) -> list[int]:
    """Counts per HIST_EDGES_MS bucket: [< first edge, each bucket ..., >= last edge]."""
    import numpy as np

    idx = np.searchsorted(np.asarray(HIST_EDGES_MS), np.asarray(samples_ms, dtype=np.float64), side="right")
    return [int(c) for c in np.bincount(idx, minlength=len(HIST_EDGES_MS) + 1)]
