"""Pull spooled reports from a device: at-least-once, deduplicated on (device, seq)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgedeploy_agent.bundle import canonical_json
from edgedeploy_agent.durable import write_atomic
from edgedeploy_agent.report import Report

from ..errors import DeviceError, validation_text
from ..inventory import Device
from ..paths import state_dir
from .agent_client import AgentClient
from .transport import Transport


def reports_dir(device: str) -> Path:
    """Default place for a device's pulled reports."""
    return state_dir() / "reports" / device


def checked_report(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """A report validated against its one definition (edgedeploy_agent.report.Report), kept as sent."""
    try:
        Report.model_validate(raw)
    except ValidationError as e:
        raise DeviceError(
            f"{where}: a report not in the format this host reads ({validation_text(e)})",
            hint="install the agent that matches this edgedeploy (`edgedeploy agent install DEVICE`)",
            code="agent-mismatch",
        ) from None
    return raw


def load_local_reports(d: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(d.glob("*.jsonl")) if d.is_dir() else []:
        lines = [line for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
        out += [checked_report(json.loads(line), str(p)) for line in lines]
    return sorted(out, key=lambda r: int(r["seq"]))


def pull_reports(transport: Transport, device: Device, d: Path) -> list[dict[str, Any]]:
    """Fetch new reports into folder `d` (fsync'd), then acknowledge them on the device.

    A report is acknowledged only once this host holds it: stored now, or stored before with the same
    content (a pull whose acknowledgement was lost). One whose (seq, bundle) is stored with other content
    is a new report under a number used twice (a device whose spool was wiped): it is kept beside the
    first one, named by its content too, never skipped."""
    client = AgentClient(transport, device)
    pending = client.call("reports", timeout=120)["reports"]
    d.mkdir(parents=True, exist_ok=True)
    stored, names = [], []
    for item in pending:
        report = checked_report(item["report"], device.name)
        slot = "" if report.get("slot", "default") == "default" else f"{report['slot']}-"  # each slot numbers its own
        path = d / f"{int(report['seq']):08d}-{slot}{report['bundle_id']}.jsonl"
        if _holds_other(path, report):
            digest = hashlib.sha256(canonical_json(report)).hexdigest()[:12]
            path = path.with_name(f"{path.stem}-{digest}.jsonl")
        if not path.exists():
            write_atomic(path, json.dumps(report) + "\n")
            stored.append(report)
        names.append(item["file"])
    if names:
        client.call("reports", "--ack", *names, timeout=120)
    return stored


def _holds_other(path: Path, report: dict[str, Any]) -> bool:
    """Whether `path` holds a report other than `report`."""
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [json.loads(line) for line in lines] != [report]
    except FileNotFoundError:
        return False
    except ValueError:  # not a report any more (edited by hand?): keep the new one beside it
        return True
