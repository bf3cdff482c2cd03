"""Content-addressed blobs on the device, and the two ways a bundle arrives (one file, or blobs).

ROOT/blobs/incoming/<sha256>.part   an upload in flight (resumed by the host; never read here)
ROOT/blobs/incoming/<sha256>        a finished upload, not yet verified (renamed by the host)
ROOT/blobs/sha256/<sha256>          verified: its bytes hashed to its name; read-only

A bundle pushed as blobs is its manifest (the exact canonical bytes), its signature and its artifacts,
each a blob. A release folder holds hard links to the blobs, so a blob shared by several releases is
stored once, and a blob with one link left (only the store's) belongs to no release: pruning removes it.
"""

import os
import re
import shutil
from pathlib import Path
from typing import Optional

from .bundle import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Manifest,
    check_artifact_name,
    read_signed_manifest,
    sha256_file,
    verify_bundle,
)
from .durable import atomic_folder, move_durably
from .errors import BundleError
from .store import DeviceStore

_SHA = re.compile(r"^[0-9a-f]{64}$")


def _check_sha(sha: str) -> str:
    if not _SHA.match(sha):
        raise BundleError(f"not a sha256 blob name: {sha[:80]!r}")
    return sha


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.verified = root / "blobs" / "sha256"
        self.incoming = root / "blobs" / "incoming"

    def init(self) -> None:
        self.verified.mkdir(parents=True, exist_ok=True)
        self.incoming.mkdir(parents=True, exist_ok=True)

    def path(self, sha: str) -> Path:
        return self.verified / _check_sha(sha)

    def has(self, sha: str) -> bool:
        """True when the blob is verified; a finished upload is hashed now and kept only if it matches."""
        if self.path(sha).is_file():
            return True
        upload = self.incoming / sha
        if not upload.is_file():
            return False
        if sha256_file(upload) != sha:
            upload.unlink()  # corrupt upload: the host sends it again
            return False
        os.chmod(upload, 0o444)
        self.verified.mkdir(parents=True, exist_ok=True)
        move_durably(upload, self.path(sha))  # an upload arrives unsynced (SFTP has no fsync)
        return True

    def present(self, sha: str) -> bool:
        """Verified, or a finished upload not verified yet (read only: `has` verifies)."""
        return self.path(sha).is_file() or (self.incoming / sha).is_file()

    def partial_bytes(self, sha: str) -> int:
        try:
            return (self.incoming / f"{_check_sha(sha)}.part").stat().st_size
        except FileNotFoundError:
            return 0

    def require(self, sha: str, what: str) -> Path:
        if not self.has(sha):
            raise BundleError(f"blob {sha[:16]} ({what}) is missing or corrupt on the device", hint="push again")
        return self.path(sha)

    def remove_unused(self, sha: str) -> None:
        """Remove one blob that no release links: a finished upload or a verified blob with one link."""
        (self.incoming / _check_sha(sha)).unlink(missing_ok=True)
        p = self.path(sha)
        if p.is_file() and p.stat().st_nlink == 1:
            p.unlink()

    def collect_garbage(self) -> list[str]:
        """Remove verified blobs no release links to any more (link count 1)."""
        removed = []
        if self.verified.is_dir():
            for p in self.verified.iterdir():
                if p.is_file() and p.stat().st_nlink == 1:
                    p.unlink()
                    removed.append(p.name)
        return removed


def _link_or_copy(blob: Path, dst: Path) -> None:
    """A hard link to the blob; a copy where the kernel refuses one: with fs.protected_hardlinks (the default)
    only a file's owner may link a file it cannot write, and a blob (0444) that the deploying login uploaded is
    not the watch service's (nor the reverse) in systemd mode. The copy costs that artifact's size once."""
    try:
        os.link(blob, dst)
    except PermissionError:
        shutil.copyfile(blob, dst)
        os.chmod(dst, 0o444)


class FileSource:
    """A bundle uploaded as one .edb file; one in ROOT/incoming/ is the device's to remove, others are not."""

    def __init__(self, path: Path, store: DeviceStore) -> None:
        self.file = path
        self.uploaded = path.absolute().parent == store.incoming.absolute()

    def read(self) -> tuple[Manifest, bytes, Optional[bytes]]:
        return read_signed_manifest(self.file)

    def stage(self, store: DeviceStore) -> Manifest:
        return store.stage(self.file)

    def verify(self) -> None:
        verify_bundle(self.file)

    def discard(self) -> None:
        if self.uploaded:
            self.file.unlink(missing_ok=True)

    def remove_refused(self) -> None:
        self.discard()


class BlobSource:
    """A bundle uploaded as blobs: the manifest blob names the artifact blobs."""

    def __init__(self, store: DeviceStore, manifest_sha: str, signature_sha: Optional[str]) -> None:
        self.store, self.blobs = store, BlobStore(store.root)
        self.manifest_sha, self.signature_sha = _check_sha(manifest_sha), signature_sha

    def read(self) -> tuple[Manifest, bytes, Optional[bytes]]:
        body = self.blobs.require(self.manifest_sha, "manifest").read_bytes()
        try:
            manifest = Manifest.model_validate_json(body)
        except ValueError as e:
            raise BundleError(f"manifest blob {self.manifest_sha[:16]} is not a valid manifest: {e}") from None
        if body != manifest.canonical_bytes():
            raise BundleError(f"manifest blob {self.manifest_sha[:16]} is not canonical JSON")
        sig = None
        if self.signature_sha:
            sig = self.blobs.require(self.signature_sha, "signature").read_bytes()
        return manifest, body, sig

    def verify(self) -> None:
        """Nothing beyond read(): it hashed the manifest blob against its name (BlobStore.has), and nothing
        else of this upload is installed when the release is unchanged."""

    def stage(self, store: DeviceStore) -> Manifest:
        """Build releases/<name> from hard links to verified blobs (each hashed when it was verified)."""
        manifest, _, _ = self.read()
        final = store.release_dir(manifest.release_name)
        if final.is_dir():
            try:
                store.load_release(manifest.release_name)
                return manifest
            except BundleError:
                shutil.rmtree(final)
        missing = [a for a in manifest.artifacts if not self.blobs.has(a.sha256)]
        store.check_space(sum(a.size for a in missing))
        with atomic_folder(final) as tmp:  # releases/.tmp-<release> until it is whole
            links = {MANIFEST_NAME: self.manifest_sha}
            if self.signature_sha:
                links[SIGNATURE_NAME] = self.signature_sha
            for a in manifest.artifacts:
                check_artifact_name(a.path)  # the same rule as unpacking a bundle file
                blob = self.blobs.require(a.sha256, a.path)
                if blob.stat().st_size != a.size:
                    raise BundleError(f"blob for {a.path} is {blob.stat().st_size} bytes, manifest says {a.size}")
                links[a.path] = a.sha256
            for name, sha in links.items():
                _link_or_copy(self.blobs.path(sha), tmp / name)
        return manifest

    def discard(self) -> None:
        return None  # blobs stay until no release links them

    def remove_refused(self) -> None:
        """Remove this bundle's blobs that no release links (shared ones stay), unless another slot's transition
        runs (it may use some: a verified blob it has not linked yet has one link too); then the next
        collection removes the verified ones."""
        shas = [self.manifest_sha, *([self.signature_sha] if self.signature_sha else [])]
        for where in (self.blobs.path(self.manifest_sha), self.blobs.incoming / self.manifest_sha):
            try:
                shas += [a.sha256 for a in Manifest.model_validate_json(where.read_bytes()).artifacts]
                break
            except (OSError, ValueError):
                continue  # no readable manifest: only its own blobs are known
        with self.store.sole_blob_user() as sole:
            for sha in shas if sole else ():
                if _SHA.match(sha):
                    self.blobs.remove_unused(sha)
