import json
from pathlib import Path

import numpy as np

from edgedeploy_agent.bundle import Postprocess, read_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.loop import top_k
from edgedeploy_agent.report import stage_latency
from edgedeploy_agent.spool import Spool, ack_reports, pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import make_bundle, make_report


def test_top_k_softmax_and_label_offset(tmp_path: Path) -> None:
    m = read_manifest(make_bundle(tmp_path)).model_copy(
        update={"postprocess": Postprocess(top_k=2, softmax=True, label_offset=1)}
    )
    out = np.array([[0.0, 1.0, 3.0, 2.0]], dtype=np.float32)
    top = top_k(out, m, ["a", "b", "c"])
    assert [t[0] for t in top] == [1, 2]
    assert [t[1] for t in top] == ["b", "c"]
    e = np.exp(np.array([0.0, 1.0, 3.0, 2.0]) - 3.0)
    assert abs(top[0][2] - e[2] / e.sum()) < 1e-6


def test_percentiles() -> None:
    s = stage_latency([float(i) for i in range(1, 101)])
    assert (s.p50, s.max) == (50.5, 100.0)
    assert 95.0 <= s.p95 <= 96.0 and 99.0 <= s.p99 <= 100.0


def test_spool_is_atomic_ordered_and_acknowledged(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path / "dev")
    store.init(AgentConfig(device_name="d"))
    spool = Spool(store)
    for _ in range(3):
        r = make_report(spool.next_seq(), window_end="2026-01-01T00:00:01Z")
        spool.write(r)
    assert not list(store.spool.glob(".*.tmp"))
    pending = pending_reports(store)
    assert [r["seq"] for _, r in pending] == [1, 2, 3]
    assert json.loads((store.spool / pending[0][0]).read_text())["power"]["status"] == "unavailable"
    assert ack_reports(store, [pending[0][0], "../../etc/passwd"]) == 1
    assert [r["seq"] for _, r in pending_reports(store)] == [2, 3]
    # a restarted agent continues the sequence instead of reusing numbers
    assert Spool(store).next_seq() == 4
