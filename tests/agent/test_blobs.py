"""Bundles pushed as blobs: verified by hash, hard-linked into releases, garbage-collected."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgedeploy_agent.blobs import BlobSource, BlobStore
from edgedeploy_agent.bundle import extract_bundle, read_signed_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import BundleError, UnsignedBundle
from edgedeploy_agent.lifecycle import Deployment
from edgedeploy_agent.store import DeviceStore
from edgedeploy_agent.trust import TrustStore
from tests.agent.bundles import make_bundle
from tests.agent.test_lifecycle import ScriptedService
from tests.agent.test_trust import public


@pytest.fixture
def store(tmp_path: Path) -> DeviceStore:
    s = DeviceStore(tmp_path / "device")
    s.init(AgentConfig(device_name="t", keep_releases=2))
    BlobStore(s.root).init()
    return s


def upload(store: DeviceStore, bundle: Path, tmp: Path) -> str:
    """What the host does: every part of the bundle lands in blobs/incoming/<sha256>."""
    manifest, body, _ = read_signed_manifest(bundle)
    extract_bundle(bundle, tmp / bundle.stem)
    sha = hashlib.sha256(body).hexdigest()
    (store.root / "blobs" / "incoming" / sha).write_bytes(body)
    for a in manifest.artifacts:
        (store.root / "blobs" / "incoming" / a.sha256).write_bytes((tmp / bundle.stem / a.path).read_bytes())
    return sha


def test_deploy_from_blobs_shares_and_collects(store: DeviceStore, tmp_path: Path) -> None:
    svc = ScriptedService(store)
    blobs = BlobStore(store.root)
    versions = []
    for v in ("1", "2", "3"):
        b = make_bundle(tmp_path / v, version=v, lib_bytes=b"\x7fELF lib " + v.encode())
        sha = upload(store, b, tmp_path)
        r = Deployment(store, svc).deploy(BlobSource(store, sha, None), timeout=2)
        assert r["outcome"] == "committed"
        versions.append(r["release"])
    rel = store.release_dir(versions[-1])
    assert (rel / "labels.txt").stat().st_nlink >= 3  # one blob shared by store and two kept releases
    assert not store.release_dir(versions[0]).exists()  # pruned (keep 2)
    assert len(list(blobs.verified.iterdir())) == 2 * 2 + 1  # manifest + lib per kept release, one labels blob


def test_corrupt_upload_is_dropped_and_never_linked(store: DeviceStore, tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "a")
    sha = upload(store, b, tmp_path)
    manifest, _, _ = read_signed_manifest(b)
    lib = manifest.artifact("tvm-library").sha256
    (store.root / "blobs" / "incoming" / lib).write_bytes(b"flipped bits")
    (store.root / "blobs" / "incoming" / f"{lib}.part").write_bytes(b"half")  # in flight: ignored
    with pytest.raises(BundleError, match="missing or corrupt"):
        Deployment(store, ScriptedService(store)).deploy(BlobSource(store, sha, None), timeout=2)
    assert not (store.root / "blobs" / "incoming" / lib).exists() and store.current() is None
    assert BlobStore(store.root).partial_bytes(lib) == 4


def _blob_files(store: DeviceStore) -> set[str]:
    return {str(p.relative_to(store.root)) for p in (store.root / "blobs").rglob("*") if p.is_file()}


def test_a_refused_bundle_leaves_none_of_its_blobs_but_keeps_shared_ones(store: DeviceStore, tmp_path: Path) -> None:
    ok = make_bundle(tmp_path / "1", version="1", lib_bytes=b"\x7fELF lib 1")
    assert Deployment(store, ScriptedService(store)).deploy(BlobSource(store, upload(store, ok, tmp_path), None), 2)
    before = _blob_files(store)
    TrustStore(store.root).replace([public(Ed25519PrivateKey.generate())])  # from now on: signed bundles only
    big = make_bundle(tmp_path / "2", version="2", lib_bytes=b"\x7fELF lib 2" + bytes(3 << 20))  # same labels
    sha = upload(store, big, tmp_path)
    BlobStore(store.root).has(sha)  # the host's `facts --blobs` verified the manifest blob meanwhile
    with pytest.raises(UnsignedBundle):
        Deployment(store, ScriptedService(store)).deploy(BlobSource(store, sha, None), timeout=2)
    assert _blob_files(store) == before  # the shared labels blob stays: the committed release links it
    rel = store.release_dir(store.current() or "")
    assert (rel / "labels.txt").is_file() and store.load_release(rel.name)
