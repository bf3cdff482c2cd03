"""The report spool: one JSON-lines file per window (spool/STAMP-SEQ.jsonl, spool/STAMP-SLOT-SEQ.jsonl for a
model slot besides `default`), written atomically. Every slot's agent writes into the one spool; each numbers
its own reports (its run/report_seq), and a report names its slot.

The spool is capped on disk: when pending plus acknowledged reports exceed the cap, the oldest files
go first (acknowledged ones before pending ones) and every pending report deleted is counted, so the
host learns how many it never saw.

The sequence number is what the host deduplicates on (with the bundle id): a number handed out twice makes
the host take a new report for one it has, skip it and acknowledge it. So run/report_seq is written
atomically before the report that carries its number, and it is checked against the spool's own files
when read: a counter that is missing, unreadable or behind the highest number spooled (pending or sent;
the cap never deletes the newest file) continues after that number instead of from 0.
"""

import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Optional

from .durable import write_atomic, write_json_atomic
from .names import DEFAULT_SLOT
from .report import Report
from .store import DeviceStore, make_dirs

DEFAULT_SPOOL_MAX_BYTES = 64 << 20


class Spool:
    def __init__(self, store: DeviceStore, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES) -> None:
        self.dir, self.max_bytes, self.slot = store.spool, max_bytes, store.slot
        make_dirs(store.run_dir)
        self._seq_path = store.run_dir / "report_seq"
        self._dropped_path = store.run_dir / "spool_dropped"
        self.seq = self._last_seq()
        dropped = _read_count(self._dropped_path)
        if dropped is None:
            _warn(f"{self._dropped_path} is unreadable: the count of reports dropped at the cap restarts at 0")
        self.dropped = dropped or 0

    def _last_seq(self) -> int:
        """The last sequence number handed out: the counter, or the highest one spooled when that is more."""
        counter = _read_count(self._seq_path)
        files = [*self.dir.glob("*.jsonl"), *(self.dir / "sent").glob("*.jsonl")]
        spooled = max(_seqs(p for p in files if _slot_of(p) == self.slot), default=0)
        if counter is None or counter < spooled:
            state = "unreadable" if counter is None else f"at {counter}"
            _warn(f"{self._seq_path} is {state}; the spool holds report {spooled}: continuing after it")
            write_atomic(self._seq_path, str(spooled))
            return spooled
        return counter

    def next_seq(self) -> int:
        """The next sequence number, durably recorded before any report carries it."""
        self.seq += 1
        write_atomic(self._seq_path, str(self.seq))
        return self.seq

    def write(self, report: Report) -> Path:
        report = report.model_copy(update={"slot": self.slot})
        stamp = report.window_end.strftime("%Y%m%dT%H%M%S")
        own = "" if self.slot == DEFAULT_SLOT else f"{self.slot}-"
        path = self.dir / f"{stamp}-{own}{report.seq:08d}.jsonl"
        write_atomic(path, report.model_dump_json() + "\n")
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
            write_atomic(self._dropped_path, str(self.dropped))
        return dropped


def _read_count(path: Path) -> Optional[int]:
    """A counter file's value: 0 when it does not exist yet, None when it is empty or not a number."""
    try:
        value = int(path.read_text(encoding="ascii"))
    except FileNotFoundError:
        return 0
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


def _slot_of(p: Path) -> str:
    """The slot whose report a spool file holds (STAMP-SEQ: `default`; STAMP-SLOT-SEQ: SLOT)."""
    middle = p.stem.split("-", 1)[-1].rpartition("-")[0]
    return middle or DEFAULT_SLOT


def _seqs(files: Iterable[Path]) -> Iterable[int]:
    """The sequence numbers in spool file names (STAMP-SEQ.jsonl)."""
    for p in files:
        try:
            yield int(p.stem.rsplit("-", 1)[1])
        except (IndexError, ValueError):
            continue


def _warn(message: str) -> None:
    print(f"edgedeploy-agent: {message}", file=sys.stderr, flush=True)  # into logs/agent.log


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
