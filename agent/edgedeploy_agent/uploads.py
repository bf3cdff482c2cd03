"""Uploads no deploy will use any more, swept by `recover()` so abandoned pushes cannot fill the disk.

Uploads land in ROOT/incoming/ (a bundle file) and ROOT/blobs/incoming/ (blobs), as NAME.part while
they are written, renamed to NAME when complete; a deploy follows the last upload of its push.

- A `.part` written to within IN_FLIGHT_S is a push in progress. While one exists nothing is swept:
  the push's finished uploads wait for its deploy, however long the whole upload takes.
- Otherwise a finished upload older than IN_FLIGHT_S belongs to a push that ended without a deploy
  (refused on the host, interrupted, killed), and so does a verified blob no release links.
- A `.part` untouched for ABANDONED_PART_S is a push nobody resumed.

A refused bundle's uploads are removed at once, at refusal (lifecycle.Deployment.deploy); this sweep
is the backstop for what a killed process or a vanished host left.
"""

import time
from pathlib import Path
from typing import Optional

from .blobs import BlobStore
from .store import DeviceStore

IN_FLIGHT_S = 600.0
ABANDONED_PART_S = 24 * 3600.0


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.is_file()] if folder.is_dir() else []


def remove_stale_uploads(store: DeviceStore, now: Optional[float] = None) -> list[str]:
    """Remove stale uploads (see the module doc); returns their paths relative to the root."""
    now = time.time() if now is None else now
    blobs = BlobStore(store.root)
    uploads = _files(store.incoming) + _files(blobs.incoming)
    parts = [p for p in uploads if p.name.endswith(".part")]
    age = {p: now - p.stat().st_mtime for p in uploads}
    stale = [p for p in parts if age[p] > ABANDONED_PART_S]
    if not any(age[p] <= IN_FLIGHT_S for p in parts):
        stale += [p for p in uploads if not p.name.endswith(".part") and age[p] > IN_FLIGHT_S]
        stale += [
            p
            for p in _files(blobs.verified)
            if p.stat().st_nlink == 1 and now - p.stat().st_mtime > IN_FLIGHT_S  # linked by no release
        ]
    for p in stale:
        p.unlink(missing_ok=True)
    return sorted(str(p.relative_to(store.root)) for p in stale)
