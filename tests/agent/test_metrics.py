import socket
import urllib.request

from edgedeploy_agent.metrics import PrometheusExporter
from edgedeploy_agent.report import BatchReport, PowerReport, Report, stage_latency
from tests.agent.bundles import make_report
from tests.helpers import require_module


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_endpoint_on_localhost_only() -> None:
    require_module("prometheus_client", "DEV_PACKAGES", "pip install prometheus_client")
    port = _free_port()
    exp = PrometheusExporter(port)
    try:
        assert exp.server.server_address[0] == "127.0.0.1"
        exp.update(
            Report(
                device="d",
                seq=1,
                bundle_id="b1",
                model="m",
                model_version="1",
                runtime="tvm",
                source="v4l2:/dev/video0",
                window_start="2026-01-01T00:00:00Z",
                window_end="2026-01-01T00:00:10Z",
                frames=3,
                fps=30.0,
                latency_ms={"infer": stage_latency([1.0, 2.0, 3.0])},
                power=PowerReport(status="measured", sensor="x", mean_watts=12.5, energy_per_inference_mj=400.0),
                camera_up=False,
                reconnects=2,
                temperatures_c={"CPU-therm": 41.5},
            )
        )
        # another source (of another model slot's agent, on the same scrape): its own series, the first untouched
        exp.update(
            make_report(
                2,
                slot="cam2",
                bundle_id="b1",
                model="m",
                source="file:/data/b.mp4",
                latency_ms={"infer": stage_latency([5.0])},
                dropped_frames=4,
                frame_latency_ms=stage_latency([7.0, 9.0]),
                model_gpu_ms=stage_latency([0.5, 0.7]),
                batch=BatchReport(size=2, sources=2, max_wait_ms=10.0, mean_fill=1.5, aggregate_fps=0.6),
            )
        )
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        exp.close()
    # (labels print sorted: quantile and the rest between model and source, zone after it)
    cam, b = 'slot="default",source="v4l2:/dev/video0"', 'slot="cam2",source="file:/data/b.mp4"'
    assert f'edgedeploy_stage_latency_ms{{bundle="b1",model="m",quantile="p50",{cam},stage="infer"}} 2.0' in text
    assert f'edgedeploy_stage_latency_ms{{bundle="b1",model="m",quantile="p50",{b},stage="infer"}} 5.0' in text
    assert f'edgedeploy_frame_latency_ms{{bundle="b1",model="m",quantile="p50",{b}}} 8.0' in text
    assert f'edgedeploy_model_gpu_ms{{bundle="b1",model="m",quantile="p50",{b}}} 0.6' in text
    cam, b = f'bundle="b1",model="m",{cam}', f'bundle="b1",model="m",{b}'
    assert f"edgedeploy_camera_up{{{cam}}} 0.0" in text
    assert f"edgedeploy_power_watts{{{cam}}} 12.5" in text
    assert f'edgedeploy_temperature_celsius{{{cam},zone="CPU-therm"}} 41.5' in text
    assert f"edgedeploy_dropped_frames{{{b}}} 4.0" in text
    assert f"edgedeploy_batch_fill{{{b}}} 1.5" in text
