from pathlib import Path

from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.spool import Spool, ack_reports, pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import make_report as _report


def test_cap_drops_acknowledged_first_then_oldest_pending_and_counts(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path / "dev")
    store.init(AgentConfig(device_name="d"))
    one = len(_report(1).model_dump_json()) + 1
    spool = Spool(store, max_bytes=4 * one + one // 2)  # room for four reports
    for _ in range(3):
        spool.write(_report(spool.next_seq()))
    ack_reports(store, [pending_reports(store)[0][0]])  # seq 1 acknowledged
    spool.write(_report(spool.next_seq()))
    assert spool.dropped == 0 and len(list((store.spool / "sent").glob("*.jsonl"))) == 1
    spool.write(_report(spool.next_seq()))  # 5 files > cap: the acknowledged one goes, nothing is lost
    assert spool.dropped == 0 and not list((store.spool / "sent").glob("*.jsonl"))
    for _ in range(2):
        spool.write(_report(spool.next_seq()))
    assert [r["seq"] for _, r in pending_reports(store)] == [4, 5, 6, 7]
    assert spool.dropped == 2
    # the count survives a restart and reaches the host in every later report
    assert Spool(store).dropped == 2
