"""Optional Prometheus endpoint on localhost (the `agent-metrics` extra; prometheus_client imported lazily).

Reach it through an SSH port forward or a local node_exporter; it never listens beyond 127.0.0.1.
"""

from typing import Any

from .errors import AgentError
from .report import Report


class MetricsError(AgentError):
    code = "metrics-unavailable"


class PrometheusExporter:
    """Gauges updated once per report window (the hot path is never touched), labelled with the bundle, the
    model, the model slot on the device (`push --model`) and the source: an agent with several sources writes one
    report per source per window; each slot's agent has its own endpoint (its metrics_port), and the slot label
    keeps two slots' series apart where one Prometheus scrapes both (they may run the same model)."""

    def __init__(self, port: int, addr: str = "127.0.0.1") -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise MetricsError(
                "metrics_port is set but prometheus_client is not installed",
                hint="install the agent with the agent-metrics extra, or unset metrics_port",
            ) from None
        self.registry = prom.CollectorRegistry()
        labels = ["bundle", "model", "slot", "source"]

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            return prom.Gauge(name, doc, [*labels, *extra], registry=self.registry)

        self.latency = gauge("edgedeploy_stage_latency_ms", "per-stage latency percentile", ("stage", "quantile"))
        self.fps = gauge("edgedeploy_fps", "frames per second of busy time")
        self.frames = gauge("edgedeploy_window_frames", "frames in the last report window")
        self.camera_up = gauge("edgedeploy_camera_up", "1 when the source delivers fresh frames")
        self.reconnects = gauge("edgedeploy_source_reconnects", "times the source was lost and reopened")
        self.power = gauge("edgedeploy_power_watts", "mean power over the last window")
        self.energy = gauge("edgedeploy_energy_per_inference_mj", "energy per inference over the last window")
        self.dropped = gauge("edgedeploy_dropped_frames", "live frames replaced before they were used, last window")
        self.frame_latency = gauge("edgedeploy_frame_latency_ms", "capture to prediction (percentile)", ("quantile",))
        self.model_gpu = gauge(
            "edgedeploy_model_gpu_ms", "the model's own GPU time, sampled frames (percentile)", ("quantile",)
        )
        self.batch_fill = gauge("edgedeploy_batch_fill", "mean real frames per batched call, several sources")
        self.temp = gauge("edgedeploy_temperature_celsius", "thermal zone temperature", ("zone",))
        self.server, self.thread = prom.start_http_server(port, addr=addr, registry=self.registry)

    def update(self, r: Report) -> None:
        lab = {"bundle": r.bundle_id, "model": r.model, "slot": r.slot, "source": r.source}
        for stage, lat in r.latency_ms.items():
            for q in ("p50", "p95", "p99"):
                self.latency.labels(stage=stage, quantile=q, **lab).set(getattr(lat, q))
        self.fps.labels(**lab).set(r.fps)
        self.frames.labels(**lab).set(r.frames)
        if r.camera_up is not None:
            self.camera_up.labels(**lab).set(1 if r.camera_up else 0)
        if r.reconnects is not None:
            self.reconnects.labels(**lab).set(r.reconnects)
        if r.dropped_frames is not None:
            self.dropped.labels(**lab).set(r.dropped_frames)
        if r.frame_latency_ms is not None:
            for q in ("p50", "p95", "p99"):
                self.frame_latency.labels(quantile=q, **lab).set(getattr(r.frame_latency_ms, q))
        if r.model_gpu_ms is not None:
            for q in ("p50", "p95", "p99"):
                self.model_gpu.labels(quantile=q, **lab).set(getattr(r.model_gpu_ms, q))
        if r.batch is not None:
            self.batch_fill.labels(**lab).set(r.batch.mean_fill)
        if r.power.mean_watts is not None:
            self.power.labels(**lab).set(r.power.mean_watts)
        if r.power.energy_per_inference_mj is not None:
            self.energy.labels(**lab).set(r.power.energy_per_inference_mj)
        for zone, c in (r.temperatures_c or {}).items():
            self.temp.labels(zone=zone, **lab).set(c)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
