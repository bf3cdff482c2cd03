"""recover() sweeps uploads no push can still use, and keeps those of a push in flight."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from edgedeploy_agent.blobs import BlobStore
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.lifecycle import recover
from edgedeploy_agent.store import DeviceStore
from edgedeploy_agent.uploads import ABANDONED_PART_S, IN_FLIGHT_S
from tests.agent.doubles import ScriptedService

HOUR = 3600.0


@pytest.fixture
def store(tmp_path: Path) -> DeviceStore:
    s = DeviceStore(tmp_path / "device")
    s.init(AgentConfig(device_name="t"))
    BlobStore(s.root).init()
    return s


def put(path: Path, age_s: float, size: int = 1000) -> Path:
    path.write_bytes(bytes(size))
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def left(store: DeviceStore) -> set[str]:
    """Every upload and blob file on the device."""
    files = [*(store.root / "incoming").rglob("*"), *(store.root / "blobs").rglob("*")]
    return {str(p.relative_to(store.root)) for p in files if p.is_file()}


def test_a_push_in_flight_keeps_every_upload(store: DeviceStore) -> None:
    blobs = BlobStore(store.root)
    put(blobs.incoming / ("a" * 64), 3 * HOUR)  # its first blob, finished long ago (a slow link)
    put(blobs.incoming / f"{'b' * 64}.part", 5)  # the blob being written now
    put(store.incoming / "old.edb", 3 * HOUR)
    before = left(store)
    recover(store, ScriptedService(store))
    assert left(store) == before


def test_without_a_push_in_flight_stale_uploads_and_unlinked_blobs_go(store: DeviceStore) -> None:
    blobs = BlobStore(store.root)
    put(blobs.incoming / ("a" * 64), IN_FLIGHT_S + 60)  # finished, no deploy followed: a refused/killed push
    put(blobs.incoming / ("c" * 64), 30)  # just finished: its deploy is about to come
    put(blobs.incoming / f"{'b' * 64}.part", IN_FLIGHT_S + 60)  # interrupted, may be resumed
    put(blobs.incoming / f"{'d' * 64}.part", ABANDONED_PART_S + 60)  # nobody resumed it
    put(store.incoming / "refused.edb", IN_FLIGHT_S + 60)
    put(store.incoming / "x.edb.part", ABANDONED_PART_S + 60)
    lone = put(blobs.verified / ("e" * 64), IN_FLIGHT_S + 60)  # verified, linked by no release
    linked = put(blobs.verified / ("f" * 64), IN_FLIGHT_S + 60)
    store.releases.joinpath("r").mkdir()
    os.link(linked, store.releases / "r" / "model.so")
    assert lone.stat().st_nlink == 1
    recover(store, ScriptedService(store))
    assert left(store) == {
        f"blobs/incoming/{'c' * 64}",
        f"blobs/incoming/{'b' * 64}.part",
        f"blobs/sha256/{'f' * 64}",
    }
