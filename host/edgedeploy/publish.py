"""`edgedeploy publish`: a signed bundle as an OCI artifact in a registry (distribution API v2, plain HTTP).

The bundle maps onto an OCI image manifest with no format change:

  config   the exact canonical manifest.json bytes: its digest is the manifest sha256 the agent uses
  layers   manifest.sig (if signed), then every artifact, uncompressed: each digest is the sha256 the
           manifest lists; `org.opencontainers.image.title` names the file

The registry in distribution 2.8 has no referrers API, so the signature travels inside the artifact.
Blobs the registry already has are skipped (HEAD first). The result is `HOST:PORT/REPO@sha256:<digest>`
of the OCI manifest, which is what desired state names. Push credentials stay on this host.
"""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgedeploy_agent.bundle import canonical_json
from edgedeploy_agent.durable import write_atomic
from edgedeploy_agent.oci import (
    ARTIFACT_MEDIA_TYPE,
    CONFIG_MEDIA_TYPE,
    OCI_MANIFEST,
    SIGNATURE_MEDIA_TYPE,
    TITLE,
    parse_ref,
)

from .errors import EXIT_DEVICE, EdgeDeployError, InputError
from .paths import state_dir
from .remote.blobs import Blob, BundleBlobs, bundle_blobs

_REPO = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")


class RegistryError(EdgeDeployError):
    """The registry refused or could not be reached."""

    exit_code = EXIT_DEVICE


@dataclass(frozen=True)
class Published:
    ref: str  # HOST:PORT/REPO@sha256:...
    digest: str
    tag: str
    manifest_sha: str  # the bundle manifest's sha256 (= the OCI config digest)
    release: str
    uploaded: tuple[str, ...]  # labels of the blobs sent
    skipped: tuple[str, ...]  # labels of the blobs the registry had
    uploaded_bytes: int


def parse_registry(spec: str) -> tuple[str, str]:
    """'HOST:PORT/REPO' -> ('HOST:PORT', 'REPO'); InputError for anything else."""
    host, _, repo = spec.partition("/")
    if not host or not repo or not _REPO.match(repo) or not re.match(r"^[A-Za-z0-9.-]+(:\d{1,5})?$", host):
        raise InputError(
            f"--registry must be HOST:PORT/REPO (repository in lower case), got {spec!r}",
            hint="e.g. --registry 127.0.0.1:5000/models/mnist",
        )
    return host, repo


def oci_manifest(blobs: BundleBlobs) -> bytes:
    """The OCI image manifest for a bundle (canonical JSON, so publishing twice gives one digest)."""
    by_sha = {b.sha256: b for b in blobs.blobs}
    config = by_sha[blobs.manifest_sha]
    layers = []
    if blobs.signature_sha:
        sig = by_sha[blobs.signature_sha]
        layers.append(_desc(SIGNATURE_MEDIA_TYPE, sig.sha256, sig.size, "manifest.sig"))
    for a in blobs.manifest.artifacts:
        layers.append(_desc(ARTIFACT_MEDIA_TYPE, a.sha256, a.size, a.path))
    return canonical_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": f"sha256:{config.sha256}", "size": config.size},
            "layers": layers,
            "annotations": {"org.opencontainers.image.ref.name": blobs.manifest.release_name},
        }
    )


def _desc(media_type: str, sha: str, size: int, title: str) -> dict[str, object]:
    return {"mediaType": media_type, "digest": f"sha256:{sha}", "size": size, "annotations": {TITLE: title}}


class RegistryClient:
    """The few distribution API v2 calls a push needs, over plain HTTP(S) with optional basic auth."""

    def __init__(self, host: str, repo: str, user: str | None = None, password: str | None = None, tls: bool = False):
        self.base = f"{'https' if tls else 'http'}://{host}/v2/{repo}"
        self.auth = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            self.auth = f"Basic {token}"

    def _call(
        self, method: str, url: str, data: bytes | object | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str]]:
        req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))  # type: ignore[arg-type]
        if self.auth:
            req.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()
                return r.status, dict(r.headers.items())
        except urllib.error.HTTPError as e:
            body = e.read()[:300].decode(errors="replace")
            if e.code == 404 and method == "HEAD":
                return 404, {}
            if e.code == 401:
                raise RegistryError(
                    f"registry refused {method} {url} (401 unauthorized)",
                    hint="give the push account with --user and EDGEDEPLOY_REGISTRY_PASSWORD",
                ) from None
            raise RegistryError(f"registry answered {e.code} to {method} {url}: {body.strip()}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RegistryError(f"cannot reach the registry at {url}: {reason}") from None

    def has_blob(self, sha: str) -> bool:
        return self._call("HEAD", f"{self.base}/blobs/sha256:{sha}")[0] == 200

    def push_blob(self, blob: Blob) -> None:
        _, headers = self._call("POST", f"{self.base}/blobs/uploads/", b"")
        location = headers.get("Location") or headers.get("location")
        if not location:
            raise RegistryError("registry started an upload without a Location header")
        if location.startswith("/"):
            location = self.base.split("/v2/")[0] + location
        sep = "&" if "?" in location else "?"
        with open(blob.local, "rb") as f:
            self._call(
                "PUT",
                f"{location}{sep}digest=sha256:{blob.sha256}",
                f,
                {"Content-Type": "application/octet-stream", "Content-Length": str(blob.size)},
            )

    def put_manifest(self, reference: str, body: bytes) -> str:
        _, headers = self._call("PUT", f"{self.base}/manifests/{reference}", body, {"Content-Type": OCI_MANIFEST})
        digest = headers.get("Docker-Content-Digest") or headers.get("docker-content-digest") or ""
        return digest


def publish(
    bundle: Path,
    registry: str,
    *,
    tag: str | None = None,
    user: str | None = None,
    password: str | None = None,
    tls: bool = False,
    progress: Callable[[str], None] = lambda s: None,
) -> Published:
    """Push the bundle's blobs the registry lacks, then its OCI manifest; record the digest ref here."""
    host, repo = parse_registry(registry)
    blobs = bundle_blobs(bundle)
    if blobs.signature_sha is None:
        raise InputError(
            f"{bundle} is not signed; devices that pull pin a key and would refuse it",
            hint="sign it first: edgedeploy sign BUNDLE --key NAME",
        )
    tag = tag or blobs.manifest.release_name
    if not _TAG.match(tag):
        raise InputError(f"tag {tag!r} is not a valid OCI tag")
    client = RegistryClient(host, repo, user, password, tls)
    sent, skipped, nbytes = [], [], 0
    for b in blobs.blobs:
        if client.has_blob(b.sha256):
            skipped.append(b.label)
            continue
        progress(f"upload {b.label} ({b.size} bytes)")
        client.push_blob(b)
        sent.append(b.label)
        nbytes += b.size
    body = oci_manifest(blobs)
    import hashlib

    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    answered = client.put_manifest(tag, body)
    if answered and answered != digest:
        raise RegistryError(f"registry stored the manifest as {answered}, expected {digest}")
    ref = f"{host}/{repo}@{digest}"
    parse_ref(ref)  # the agent's parser accepts what we print
    result = Published(
        ref, digest, tag, blobs.manifest_sha, blobs.manifest.release_name, tuple(sent), tuple(skipped), nbytes
    )
    record_published(result)
    return result


def published_dir() -> Path:
    return state_dir() / "published"


def record_published(p: Published) -> None:
    """STATE/published/<manifest sha>.json: which ref a bundle was published as (what rollout --via mqtt names)."""
    d = published_dir()
    d.mkdir(parents=True, exist_ok=True)
    write_atomic(d / f"{p.manifest_sha}.json", json.dumps({"ref": p.ref, "release": p.release, "tag": p.tag}, indent=1))


def published_ref(blobs: BundleBlobs) -> str:
    """The digest ref this bundle was published as; InputError if it was not published from this host."""
    path = published_dir() / f"{blobs.manifest_sha}.json"
    try:
        return str(json.loads(path.read_text())["ref"])
    except (OSError, ValueError, KeyError):
        raise InputError(
            f"bundle {blobs.manifest.release_name} has not been published from this host",
            hint="run `edgedeploy publish BUNDLE --registry HOST:PORT/REPO` first",
        ) from None
