"""The report spool: one JSON-lines file per window, written to a temp name and renamed when complete.

The spool is capped on disk: when pending plus acknowledged reports exceed the cap, the oldest files
go first (acknowledged ones before pending ones) and every pending report deleted is counted, so the
host learns how many it never saw.
"""

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .durable import write_json_atomic
from .report import Report
from .store import DeviceStore

DEFAULT_SPOOL_MAX_BYTES = 64 << 20


class Spool:
    def __init__(self, store: DeviceStore, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> None:
        self.dir, self.max_bytes = store.spool, max_bytes
        self._seq_path = store.run_dir / "report_seq"
        self._dropped_path = store.run_dir / "spool_dropped"
        self.seq = _read_int(self._seq_path)
        self.dropped = _read_int(self._dropped_path)

    def next_seq(self) -> int:
        self.seq += 1
        self._seq_path.write_text(str(self.seq))
        return self.seq

    def write(self, report: Report) -> Path:
        stamp = report.window_end.strftime("%Y%m%dT%H%M%S")
        path = self.dir / f"{stamp}-{report.seq:08d}.jsonl"
        tmp = self.dir / f".{path.name}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(report.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.enforce_cap(keep=path)
        return path

    def enforce_cap(self, keep: Path) -> int:
        """Delete the oldest files until the spool fits its cap; returns pending reports dropped now."""
        sent = sorted((self.dir / "sent").glob("*.jsonl"))
        pending = sorted(p for p in self.dir.glob("*.jsonl") if p != keep)
        files = [(p, p.stat().st_size) for p in [*sent, *pending, keep]]
        total = sum(size for _, size in files)
        dropped = 0
        for p, size in files[:-1]:  # the report just written is never dropped
            if total <= self.max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
            if p.parent == self.dir:
                dropped += 1
        if dropped:
            self.dropped += dropped
            self._dropped_path.write_text(str(self.dropped))
        return dropped


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return 0


def pending_reports(store: DeviceStore) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in sorted(store.spool.glob("*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append((p.name, json.loads(line)))
    return out


def ack_reports(store: DeviceStore, names: Sequence[str]) -> int:
    moved = 0
    for name in names:
        src = store.spool / Path(name).name
        if src.is_file():
            os.replace(src, store.spool / "sent" / src.name)
            moved += 1
    write_json_atomic(store.run_dir / "last_ack.json", {"count": moved})
    return moved
