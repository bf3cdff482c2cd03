from __future__ import annotations

import os
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("counter", "warned"),
    [("", True), ("\x00\x00\x17", True), ("3x", True), (None, True), ("1", True), ("7", False)],
    ids=["empty", "zeros", "garbage", "missing", "behind", "ahead"],
)
def test_the_sequence_continues_after_the_highest_spooled_report_whatever_the_counter_says(
    tmp_path: Path, counter: str | None, warned: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """The counter is written atomically, so a power cut cannot tear it; one that is torn anyway (another
    writer, a file system that lies, a hand edit) or lost must not send the numbers back to 1."""
    store = DeviceStore(tmp_path / "dev")
    store.init(AgentConfig(device_name="d"))
    spool = Spool(store)
    for _ in range(3):
        spool.write(_report(spool.next_seq()))
    ack_reports(store, [name for name, _ in pending_reports(store)][:2])  # 1 and 2 sent, 3 pending
    seq_file = store.run_dir / "report_seq"
    if counter is None:
        seq_file.unlink()
    else:
        seq_file.write_bytes(counter.encode("latin-1"))
    capsys.readouterr()
    restarted = Spool(store)
    assert restarted.next_seq() == (8 if counter == "7" else 4)  # a counter ahead (a number never spooled) stands
    assert ("continuing after it" in capsys.readouterr().err) is warned
    assert seq_file.read_text() == str(restarted.seq)


def test_the_counters_are_replaced_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DeviceStore(tmp_path / "dev")
    store.init(AgentConfig(device_name="d"))
    spool = Spool(store, max_bytes=1 << 16)
    spool.next_seq()

    def power_cut(*args: object) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", power_cut)
    with pytest.raises(OSError):
        spool.next_seq()
    monkeypatch.undo()
    assert (store.run_dir / "report_seq").read_text() == "1"  # the old number, never an empty file
    assert sorted(p.name for p in store.run_dir.iterdir() if p.name.endswith(".tmp")) == []
