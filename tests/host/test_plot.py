from pathlib import Path

import cv2
import pytest

from edgedeploy.errors import InputError
from edgedeploy.plot import merged_histograms, plot_reports, power_series
from edgedeploy_agent.report import HIST_EDGES_MS, latency_histogram


def _report(seq: int, infer_ms: list[float], power: dict) -> dict:
    return {
        "seq": seq,
        "model": "m",
        "model_version": "1",
        "bundle_id": "b",
        "window_end": f"2026-11-29T20:00:{seq:02d}Z",
        "latency_hist": {"infer": latency_histogram(infer_ms)},
        "power": power,
    }


def test_histograms_add_up_and_unmeasured_power_is_left_out(tmp_path: Path) -> None:
    reports = [
        _report(1, [1.0, 1.1, 50.0], {"status": "measured", "mean_watts": 10.0, "idle_watts": 4.0}),
        _report(2, [1.05], {"status": "unavailable", "reason": "no sensor"}),
        _report(3, [20000.0], {"status": "measured", "mean_watts": 11.0}),
    ]
    h = merged_histograms(reports)["infer"]
    assert h.sum() == 5 and h[-1] == 1  # 20 s lands in the overflow bucket
    assert h[int(sum(e <= 1.0 for e in HIST_EDGES_MS))] == 3  # 1.0, 1.05, 1.1 share the bucket from 1.0 ms
    t, w, idle = power_series(reports)
    assert w == [10.0, 11.0] and idle == [4.0, None] and len(t) == 2
    out = plot_reports("d", reports, tmp_path / "p.png")
    assert out["power_points"] == 2 and cv2.imread(str(tmp_path / "p.png")) is not None


def test_no_reports_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no reports"):
        plot_reports("d", [], tmp_path / "p.png")
