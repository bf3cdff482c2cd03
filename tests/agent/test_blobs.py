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
from tests.agent.bundles import make_bundle, public
from tests.agent.doubles import ScriptedService
from tests.helpers import require, require_root


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


def test_a_blob_another_user_wrote_is_copied_where_the_kernel_refuses_a_link() -> None:
    """fs.protected_hardlinks: the watch service cannot hard-link a 0444 blob the deploying login uploaded (seen
    in the arm64 systemd container after an SSH push); the release gets a copy. Run as user nobody, since root
    may link anything."""
    import sys
    import tempfile

    require_root("to act as another user")
    protected = Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1"
    require("PROTECTED_HARDLINKS", None if protected else "needs fs.protected_hardlinks=1")
    with tempfile.TemporaryDirectory() as d:  # pytest's tmp_path is root's alone (0700 above it)
        _copied_as_nobody(Path(d), sys.executable)


def _copied_as_nobody(tmp_path: Path, python: str) -> None:
    import subprocess

    tmp_path.chmod(0o755)
    blob = tmp_path / "blob"
    blob.write_bytes(b"model bytes")
    blob.chmod(0o444)  # root's, as a blob in the store is
    out = tmp_path / "release"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    script = (
        "import os, sys; from pathlib import Path; from edgedeploy_agent.blobs import _link_or_copy\n"
        "try:\n    os.link(sys.argv[1], sys.argv[2] + '.link')\nexcept PermissionError:\n    print('refused')\n"
        "_link_or_copy(Path(sys.argv[1]), Path(sys.argv[2]) / 'model.so')\n"
    )
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", script]
    p = subprocess.run([*as_nobody, str(blob), str(out)], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "refused", p.stdout + p.stderr  # a plain link fails there
    copy = out / "model.so"
    assert copy.read_bytes() == b"model bytes" and copy.stat().st_mode & 0o777 == 0o444 and copy.stat().st_nlink == 1
