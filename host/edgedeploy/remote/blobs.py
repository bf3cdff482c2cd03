"""A bundle as content-addressed blobs (manifest, signature, artifacts), cached on the host.

The device stores blobs by sha256, so a push sends only the blobs it lacks: a re-push sends nothing,
and a new bundle that shares a library with an earlier one sends only what changed.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from edgedeploy_agent.bundle import Manifest, extract_bundle, read_signed_manifest
from edgedeploy_agent.durable import move_durably

from ..errors import InputError, agent_input
from ..paths import cache_dir


@dataclass(frozen=True)
class Blob:
    sha256: str
    size: int
    label: str  # manifest.json, manifest.sig or the artifact path
    local: Path


@dataclass(frozen=True)
class BundleBlobs:
    manifest: Manifest
    manifest_sha: str
    signature_sha: str | None
    blobs: tuple[Blob, ...]

    @property
    def total_bytes(self) -> int:
        return sum(b.size for b in self.blobs)


def _put_cache(store: Path, data_path: Path, sha: str) -> Path:
    dst = store / sha
    if not dst.is_file():
        move_durably(data_path, dst)  # a torn blob here would be sent on every push
    return dst


def bundle_blobs(bundle: Path) -> BundleBlobs:
    """Verify every byte of the bundle (by unpacking it) and file its parts in the host's blob cache."""
    if not bundle.is_file():
        raise InputError(f"bundle file {bundle} does not exist")
    store = cache_dir() / "blobs"
    store.mkdir(parents=True, exist_ok=True)
    with agent_input():
        manifest, body, sig = read_signed_manifest(bundle)
        with tempfile.TemporaryDirectory(prefix=".unpack-", dir=store) as tmp:
            extract_bundle(bundle, Path(tmp) / "b")
            blobs = []
            for label, data in (("manifest.json", body), ("manifest.sig", sig)):
                if data is None:
                    continue
                sha = hashlib.sha256(data).hexdigest()
                (Path(tmp) / sha).write_bytes(data)
                blobs.append(Blob(sha, len(data), label, _put_cache(store, Path(tmp) / sha, sha)))
            for a in manifest.artifacts:
                blobs.append(Blob(a.sha256, a.size, a.path, _put_cache(store, Path(tmp) / "b" / a.path, a.sha256)))
    if body != manifest.canonical_bytes():
        raise InputError(f"{bundle}: manifest.json is not canonical JSON (not written by edgedeploy?)")
    unique = {b.sha256: b for b in blobs}  # two artifacts with the same bytes are one blob
    return BundleBlobs(
        manifest,
        blobs[0].sha256,
        blobs[1].sha256 if sig is not None else None,
        tuple(unique.values()),
    )
