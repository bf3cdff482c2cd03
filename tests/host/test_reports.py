"""Stored reports are validated against the agent's one Report definition: a renamed key is refused."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from edgedeploy.errors import DeviceError
from edgedeploy.inventory import Device
from edgedeploy.remote.reports import load_local_reports, pull_reports
from edgedeploy.remote.transport import LocalTransport
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.spool import Spool, pending_reports
from edgedeploy_agent.store import DeviceStore
from tests.agent.bundles import make_report


def test_reports_load_in_seq_order_and_a_renamed_key_is_refused(tmp_path: Path) -> None:
    for seq in (3, 1, 2):
        (tmp_path / f"{seq:08d}-b.jsonl").write_text(make_report(seq).model_dump_json() + "\n")
    assert [r["seq"] for r in load_local_reports(tmp_path)] == [1, 2, 3]
    bad = json.loads(make_report(4).model_dump_json())
    bad["frames_seen"] = bad.pop("frames")
    (tmp_path / "00000004-b.jsonl").write_text(json.dumps(bad) + "\n")
    with pytest.raises(DeviceError, match="00000004-b.jsonl: a report not in the format") as e:
        load_local_reports(tmp_path)
    assert e.value.code == "agent-mismatch"


AGENT = Path(sys.executable).with_name("edgedeploy-agent")


def _device(tmp_path: Path) -> tuple[DeviceStore, Device]:
    """A real agent root, reached the way the host reaches a device (a transport running edgedeploy-agent)."""
    store = DeviceStore(tmp_path / "dev")
    store.init(AgentConfig(device_name="d"))
    dev = Device(name="d", host="localhost", profile="cpu-x86_64", root=str(store.root), transport="local")
    return store, dev.model_copy(update={"agent_command": str(AGENT)})


def _agent_spools(store: DeviceStore, n: int, frames: int) -> list[dict]:
    """A (re)started agent spools `n` reports the way its loop does: number first, then the report."""
    spool = Spool(store)
    out = []
    for _ in range(n):
        report = make_report(spool.next_seq(), frames=frames)
        spool.write(report)
        out.append(json.loads(report.model_dump_json()))
    return out


def _by_seq(reports: list[dict]) -> list[tuple[int, int]]:
    return sorted((r["seq"], r["frames"]) for r in reports)


@pytest.mark.parametrize("torn", [b"", b"\x00\x00\x17\x00"], ids=["empty", "garbage"])
def test_a_torn_spool_counter_loses_no_report_and_acknowledges_none_it_did_not_store(
    tmp_path: Path, torn: bytes
) -> None:
    store, dev = _device(tmp_path)
    host, t = tmp_path / "host-reports", LocalTransport()
    spooled = _agent_spools(store, 3, frames=1)
    assert pull_reports(t, dev, host) == spooled
    spooled += _agent_spools(store, 1, frames=2)  # spooled, not pulled yet, when the power goes
    (store.run_dir / "report_seq").write_bytes(torn)  # and the counter comes back torn
    spooled += _agent_spools(store, 2, frames=3)  # the agent after the reboot
    # had it counted from 0 again, reports 1 and 2 would be taken for the pulled ones, skipped, acknowledged
    assert [r["seq"] for r in spooled] == [1, 2, 3, 4, 5, 6]
    assert pull_reports(t, dev, host) == spooled[3:]
    assert load_local_reports(host) == spooled  # every report, once
    assert pending_reports(store) == []  # all acknowledged, each once it was stored


def test_a_number_used_twice_is_kept_beside_the_first_never_skipped(tmp_path: Path) -> None:
    """A device whose spool went with its counter (a wiped root) numbers from 1 again: the host stores those
    reports beside the ones it has under the same number, then acknowledges them; a repeated pull adds nothing."""
    store, dev = _device(tmp_path)
    host, t = tmp_path / "host-reports", LocalTransport()
    first = _agent_spools(store, 2, frames=1)
    pull_reports(t, dev, host)
    shutil.rmtree(store.spool)
    (store.run_dir / "report_seq").unlink()
    store.init(AgentConfig(device_name="d"))
    again = _agent_spools(store, 2, frames=5)
    assert [r["seq"] for r in again] == [1, 2]
    assert pull_reports(t, dev, host) == again
    assert pending_reports(store) == []
    assert _by_seq(load_local_reports(host)) == _by_seq(first + again)
    for p in (store.spool / "sent").glob("*.jsonl"):  # the acknowledgement lost: the device sends them again
        os.replace(p, store.spool / p.name)
    assert pull_reports(t, dev, host) == [] and pending_reports(store) == []
    assert _by_seq(load_local_reports(host)) == _by_seq(first + again)
