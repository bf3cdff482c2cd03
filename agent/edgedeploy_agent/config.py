"""The device's agent configuration (ROOT/agent.json), written by `edgedeploy-agent init`."""

import socket
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .names import DEFAULT_SLOT, DEVICE_NAME_PATTERN, DEVICE_NAME_RULE, check_extra_slots
from .unit import slot_unit


class ModelSlotConfig(BaseModel):
    """What differs for one more model slot (ROOT/models/NAME): its own source, unit and metrics port. The
    `default` slot takes these from the top level, as before slots existed."""

    model_config = ConfigDict(extra="forbid")

    source: Optional[str] = Field(default=None, description="frame source URI this slot's model serves")
    unit: Optional[str] = Field(default=None, description="systemd mode: the unit that serves this slot")
    metrics_port: Optional[int] = Field(default=None, ge=1, le=65535)


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # the host's rule (names.py): a name MQTT, the broker or the inventory would refuse never gets this far
    device_name: str = Field(default_factory=socket.gethostname, pattern=DEVICE_NAME_PATTERN)
    service: Literal["process", "systemd"] = "process"
    unit: str = "edgedeploy-agent.service"
    source: Optional[str] = Field(default=None, description="frame source URI, e.g. file:/data/clip.mp4")
    sources: list[str] = Field(
        default_factory=list,
        description="several frame sources served by one agent (instead of `source`): each keeps its own capture, "
        "reconnects, reports and health; their frames share the bundle's batch",
    )
    max_batch_wait_ms: float = Field(
        default=10.0,
        ge=0,
        description="several sources: how long a batch waits for frames from the other sources once it holds one",
    )
    frame_spin_ms: float = Field(
        default=0.0,
        ge=0,
        le=1000,
        description="one source: how long the loop polls for the next frame before it sleeps until the capture "
        "hands one over; a frame that comes sooner starts on a core that never went idle (lower latency a frame, "
        "one core busy, fewer fps where the decoder needs every core); 0: sleep at once",
    )
    tvm_runtime_lib: Optional[str] = Field(default=None, description="path of libtvm_runtime.so")
    cuda_backend: Literal["auto", "edgedeploy", "tvm"] = Field(
        default="auto",
        description="GPU bundles: edgedeploy's CUDA backend (CUDA 11.4+ drivers) or the TVM wheel's (CUDA 13+); "
        "auto: edgedeploy's where installed",
    )
    cuda_backend_lib: Optional[str] = Field(
        default=None, description="path of libedgedeploy_cuda.so (default: beside libtvm_runtime.so)"
    )
    system_python: Optional[str] = Field(
        default=None,
        description="JetPack's Python 3.8 (e.g. /usr/bin/python3.8): TensorRT and gst:/csi: capture run in a sidecar "
        "worker under it when the agent's own Python cannot import tensorrt, or its OpenCV has no GStreamer",
    )
    sidecar_timeout_s: float = Field(
        default=10.0, gt=0, description="a sidecar worker that takes longer over one frame is killed and reported"
    )
    report_interval_s: float = Field(default=10.0, gt=0)
    record_predictions: bool = True
    keep_releases: int = Field(default=3, ge=2)
    health_timeout_s: float = Field(default=60.0, gt=0)
    health_frames: int = Field(
        default=3, ge=0, description="real frames a deploy must serve before it is healthy (with a source)"
    )
    spool_max_bytes: int = Field(default=64 << 20, ge=1 << 16, description="disk cap of spool/ (oldest dropped)")
    idle_baseline_s: float = Field(default=2.0, ge=0, description="idle power measured before serving; 0: off")
    power_interval_s: float = Field(default=0.02, gt=0, description="power sampling period (sampled sensors)")
    metrics_port: Optional[int] = Field(default=None, ge=1, le=65535, description="Prometheus on 127.0.0.1")
    profile: Optional[str] = Field(default=None, description="device profile; bundles for another are refused")
    models: dict[str, ModelSlotConfig] = Field(
        default_factory=dict, description="model slots besides `default`, by name (edgedeploy push --model NAME)"
    )

    @field_validator("models")
    @classmethod
    def _slot_names(cls, v: dict[str, ModelSlotConfig]) -> dict[str, ModelSlotConfig]:
        check_extra_slots(v)
        return v

    def for_slot(self, slot: str) -> "AgentConfig":
        """The configuration one slot's agent runs with: the slot's own source, unit and metrics port (none set:
        none; the unit then the slot's instance of the template `agent install` makes, unit.slot_unit) over the
        device's."""
        if slot == DEFAULT_SLOT:
            return self
        own = self.models.get(slot) or ModelSlotConfig()
        return self.model_copy(
            update={
                "source": own.source,
                "sources": [],
                "metrics_port": own.metrics_port,
                "unit": own.unit or slot_unit(slot),
            }
        )

    @model_validator(mode="after")
    def _one_way_to_name_sources(self) -> "AgentConfig":
        if self.source is not None and self.sources:
            raise ValueError("give source (one camera) or sources (several), not both")
        if len(set(self.sources)) != len(self.sources):
            raise ValueError("sources names a source twice")
        return self

    @property
    def source_uris(self) -> list[str]:
        """The sources this agent serves: `sources`, or the one `source`, or none."""
        return list(self.sources) or ([self.source] if self.source else [])


CONFIG_HINT = "edgedeploy-agent init --device-name NAME (" + DEVICE_NAME_RULE + ")"


def config_error(e: ValidationError) -> str:
    """The first problem of an invalid configuration, in one line (a device name names the rule)."""
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"])
    if where == "device_name":
        return f"device_name {str(err.get('input'))[:80]!r} is not a device name ({DEVICE_NAME_RULE})"
    return f"{where}: {err['msg']}" if where else str(err["msg"]).removeprefix("Value error, ")
