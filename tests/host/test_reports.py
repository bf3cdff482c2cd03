"""Stored reports are validated against the agent's one Report definition: a renamed key is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgedeploy.errors import DeviceError
from edgedeploy.remote.reports import load_local_reports
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
