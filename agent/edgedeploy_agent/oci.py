"""Pull a bundle published as an OCI artifact: a small stdlib HTTP client with Range resume and sha256 checks.

The artifact's config is the bundle's canonical manifest.json, its layers are manifest.sig and the
artifacts (see the host's publish.py). Every blob goes to ROOT/blobs/incoming/<sha>.part, resumed with
a Range request from the size already there; a server that answers a range request with a full 200
(a cold pull-through cache) restarts that blob. A finished blob is renamed to incoming/<sha> and
verified by BlobStore.has (hashed; deleted on mismatch), so nothing unverified is ever used. After the
pull the existing deploy path (BlobSource -> Deployment) checks signature, serial, expiry and profile.
"""

import errno
import hashlib
import http.client
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from typing import Any, Callable, NamedTuple, Optional

from .blobs import BlobStore
from .durable import move_durably
from .errors import AgentError, BundleError, InsufficientSpace
from .store import check_free

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.edgedeploy.manifest.v1+json"
SIGNATURE_MEDIA_TYPE = "application/vnd.edgedeploy.signature.v1+json"
ARTIFACT_MEDIA_TYPE = "application/vnd.edgedeploy.artifact.v1"
TITLE = "org.opencontainers.image.title"

_REF = re.compile(r"^(?P<host>[A-Za-z0-9.-]+(?::\d{1,5})?)/(?P<repo>[a-z0-9._/-]+)@sha256:(?P<sha>[0-9a-f]{64})$")
CHUNK = 1 << 16


class PullError(AgentError):
    """The registry could not be reached or served something that does not match its digest."""

    code = "pull-failed"
    exit_code = 13  # 11 and 12 are frame-failed and source-unavailable (errors.py)


class DigestMismatch(PullError):
    code = "blob-digest-mismatch"


class PullCancelled(PullError):
    """`OciPuller.abort()` was called (a newer desired document came): the `.part` stays for a resume."""

    code = "pull-cancelled"


class Ref(NamedTuple):
    host: str
    repo: str
    sha: str


class Pulled(NamedTuple):
    manifest_sha: str  # the bundle manifest blob (= the OCI config)
    signature_sha: Optional[str]
    fetched_bytes: int
    restarts: int  # blobs restarted because a range request got a full answer


def parse_ref(ref: str) -> Ref:
    m = _REF.match(ref)
    if not m:
        raise BundleError(f"not a digest reference HOST[:PORT]/REPO@sha256:<64 hex>: {ref[:120]!r}")
    return Ref(m["host"], m["repo"], m["sha"])


Progress = Callable[[int, int], None]  # (bytes on disk, total bytes)


class OciPuller:
    """Fetches one artifact from `base_url` (the device's read-only endpoint, e.g. a site cache)."""

    def __init__(self, base_url: str, blobs: BlobStore, timeout: float = 30.0) -> None:
        self.base = base_url.rstrip("/")
        self.blobs, self.timeout = blobs, timeout
        self.cancelled = threading.Event()
        self._response: Any = None  # the response being read, for abort() to cut

    def abort(self) -> None:
        """From another thread: stop the pull within one chunk. A read blocked on a silent server is cut by
        shutting its socket down; what is on disk stays (`.part`, resumed by the next pull)."""
        self.cancelled.set()
        sock = getattr(getattr(getattr(self._response, "fp", None), "raw", None), "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise PullCancelled("the download was cancelled: a newer desired document came")

    def _open(self, url: str, headers: dict[str, str]) -> Any:
        self._check_cancelled()
        req = urllib.request.Request(url, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise PullError(f"registry answered {e.code} for {url}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            raise PullError(f"cannot reach the registry at {url}: {getattr(e, 'reason', e)}") from None

    def manifest(self, ref: Ref) -> dict[str, Any]:
        """The OCI manifest, checked against the digest in the reference."""
        url = f"{self.base}/v2/{ref.repo}/manifests/sha256:{ref.sha}"
        try:
            with self._open(url, {"Accept": OCI_MANIFEST}) as r:
                self._response = r
                body = r.read(4 << 20)
        except (OSError, http.client.HTTPException) as e:
            self._check_cancelled()
            raise PullError(f"reading {url}: {e}") from None
        finally:
            self._response = None
        self._check_cancelled()
        if hashlib.sha256(body).hexdigest() != ref.sha:
            raise DigestMismatch(f"manifest from {url} does not hash to sha256:{ref.sha[:16]}...")
        try:
            doc = json.loads(body)
            config = doc["config"]
            if not isinstance(doc["layers"], list):
                raise ValueError("layers is not a list")
            if config["mediaType"] != CONFIG_MEDIA_TYPE:
                raise ValueError(f"config media type {config['mediaType']}")
        except (ValueError, KeyError, TypeError) as e:
            raise BundleError(f"{ref.repo}@sha256:{ref.sha[:16]} is not an edgedeploy bundle artifact: {e}") from None
        return dict(doc)

    def pull(self, ref: Ref, progress: Progress = lambda done, total: None) -> Pulled:
        doc = self.manifest(ref)
        wanted = [_descriptor(doc["config"])] + [_descriptor(layer) for layer in doc["layers"]]
        sig = [d[0] for d, layer in zip(wanted[1:], doc["layers"]) if layer.get("mediaType") == SIGNATURE_MEDIA_TYPE]
        total = sum(size for _, size in wanted)
        done = sum(size for sha, size in wanted if self.blobs.has(sha))
        fetched = restarts = 0
        self.blobs.init()
        self.check_space([(sha, size) for sha, size in wanted if not self.blobs.has(sha)])
        for sha, size in wanted:
            if self.blobs.has(sha):
                continue
            got, restarted = self._blob(ref, sha, size, _offset(progress, done, total))
            fetched += got
            restarts += restarted
            done += size
            progress(done, total)
        return Pulled(wanted[0][0], sig[0] if sig else None, fetched, restarts)

    def check_space(self, missing: list[tuple[str, int]]) -> None:
        """Before the first byte: the bytes still to come (the manifest's sizes, less what the `.part` files
        hold) and a margin must fit in the free space of the device root, or the pull is refused (`no-space`)
        and this bundle's `.part` files go (they could not complete; kept, they would only fill the disk)."""
        needed = sum(size - min(self.blobs.partial_bytes(sha), size) for sha, size in missing)
        try:
            check_free(self.blobs.incoming, needed)
        except InsufficientSpace:
            for sha, _ in missing:
                (self.blobs.incoming / f"{sha}.part").unlink(missing_ok=True)
            raise

    def _blob(self, ref: Ref, sha: str, size: int, progress: Callable[[int], None]) -> tuple[int, int]:
        """Download one blob into incoming/<sha>.part (resuming), then verify it. Returns (bytes fetched, restarts)."""
        part = self.blobs.incoming / f"{sha}.part"
        have = part.stat().st_size if part.exists() else 0
        if have > size:
            part.unlink()
            have = 0
        url = f"{self.base}/v2/{ref.repo}/blobs/sha256:{sha}"
        fetched = restarted = 0
        if have < size:
            headers = {"Range": f"bytes={have}-"} if have else {}
            with self._open(url, headers) as r:
                self._response = r
                if have and r.status != 206:
                    have, restarted = 0, 1  # the whole blob came back: start this blob again
                mode = "ab" if have else "wb"
                try:
                    with open(part, mode) as f:
                        while True:
                            # read1: what has arrived (up to CHUNK), not a blocking wait for a whole CHUNK, so
                            # a trickling server cannot hold off abort() for longer than one byte takes
                            chunk = r.read1(CHUNK)
                            self._check_cancelled()
                            if not chunk:
                                break
                            f.write(chunk)
                            have += len(chunk)
                            fetched += len(chunk)
                            if have > size:
                                break
                            progress(have)
                except OSError as e:
                    self._check_cancelled()  # abort() shut the socket down
                    if e.errno in (errno.ENOSPC, errno.EDQUOT):  # another writer filled the disk meanwhile
                        part.unlink(missing_ok=True)
                        raise InsufficientSpace(
                            f"the disk filled up at {have} of {size} bytes of blob {sha[:16]}; the partial blob "
                            "was removed",
                            hint="free space on the device or remove old releases",
                        ) from None
                    raise PullError(f"download of blob {sha[:16]} broke off at {have} of {size} bytes: {e}") from None
                except http.client.HTTPException as e:
                    self._check_cancelled()
                    raise PullError(f"download of blob {sha[:16]} broke off at {have} of {size} bytes: {e}") from None
                finally:
                    self._response = None
        self._check_cancelled()
        if have != size:
            if have > size:
                part.unlink()
                raise DigestMismatch(f"blob {sha[:16]} is longer than its {size} bytes; discarded")
            raise PullError(f"download of blob {sha[:16]} ended at {have} of {size} bytes")
        move_durably(part, self.blobs.incoming / sha)
        if not self.blobs.has(sha):  # hashed; a mismatch is deleted, so the next try starts clean
            raise DigestMismatch(f"blob {sha[:16]} from {url} does not match its sha256; discarded")
        return fetched, restarted


def _offset(progress: Progress, base: int, total: int) -> Callable[[int], None]:
    return lambda n: progress(base + n, total)


def _descriptor(d: Any) -> tuple[str, int]:
    try:
        digest, size = str(d["digest"]), int(d["size"])
    except (KeyError, TypeError, ValueError):
        raise BundleError(f"malformed OCI descriptor: {str(d)[:120]}") from None
    if not digest.startswith("sha256:") or not re.match(r"^[0-9a-f]{64}$", digest[7:]) or size < 0:
        raise BundleError(f"unsupported digest {digest[:80]!r}")
    return digest[7:], size
