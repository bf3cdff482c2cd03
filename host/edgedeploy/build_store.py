"""The host's build store: files a bundle was built from that only the host needs, kept by sha256.

A bundle carries what the device runs. The FP32 source model (for `eval`, `tune`, rebuilds) and the Q/DQ
model a TVM INT8 library was compiled from stay on the host, named in `manifest.host_files` by sha256,
size, file name and role, as read-only copies at

    <store>/sha256/<hex>        <store> = paths.build_store_dir() (under the cache folder by default)

Every lookup checks the sha256. Schema 1 bundles carried these files as artifacts; `host_file` takes them
from the unpacked bundle then. A file the store lacks can be handed over (`--source PATH`): it is used
when its sha256 is one the manifest names, and stored again for next time.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from edgedeploy_agent.bundle import HostFile, Manifest, sha256_file
from edgedeploy_agent.durable import move_durably

from .errors import InputError
from .paths import build_store_dir

_CHUNK = 1 << 20


class HostFileMissing(InputError):
    """A host-only file of a bundle is neither in the build store nor handed over with --source."""


def stored_path(sha256: str) -> Path:
    return build_store_dir() / "sha256" / sha256


def keep(path: Path, role: str, name: str, sha256: str | None = None) -> HostFile:
    """Copy `path` into the store (once per content) and describe it; a known `sha256` is checked."""
    dest = stored_path(sha256) if sha256 else None
    if dest is not None and dest.is_file() and dest.stat().st_size == path.stat().st_size:
        return HostFile(name=name, role=role, sha256=sha256, size=dest.stat().st_size)  # type: ignore[arg-type]
    digest, size = _copy_in(path, sha256)
    return HostFile(name=name, role=role, sha256=digest, size=size)  # type: ignore[arg-type]


def _copy_in(path: Path, sha256: str | None) -> tuple[str, int]:
    """Copy `path` to <store>/sha256/<its sha256> (atomically, read-only); returns sha256 and size."""
    root = build_store_dir() / "sha256"
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = tempfile.TemporaryDirectory(dir=root, prefix=".tmp-")
    except OSError as e:
        raise InputError(
            f"cannot write the build store {root}: {e.strerror}", hint="point EDGEDEPLOY_STORE_DIR at a writable folder"
        ) from None
    h, size = hashlib.sha256(), 0
    with work:
        tmp = Path(work.name) / "file"  # its name is its sha256, known once it is copied
        with open(tmp, "wb") as out, open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        digest = h.hexdigest()
        if sha256 is not None and digest != sha256:
            raise InputError(f"{path} changed while it was being stored (sha256 now {digest[:16]}…)")
        os.chmod(tmp, 0o444)
        move_durably(tmp, root / digest)
    return digest, size


def restore(manifest: Manifest, have: Mapping[str, Path]) -> bool:
    """Store again what the store lost and `have` (sha256 -> file) holds; True when every host file is there."""
    for hf in manifest.host_files:
        if not stored_path(hf.sha256).is_file():
            if hf.sha256 not in have:
                return False
            keep(have[hf.sha256], hf.role, hf.name, hf.sha256)
    return True


def has_file(manifest: Manifest, role: str) -> bool:
    """Whether the bundle has a `role` file, inside it (artifact) or on the host (host file)."""
    return any(a.role == role for a in manifest.artifacts) or any(h.role == role for h in manifest.host_files)


def host_file(manifest: Manifest, role: str, release_dir: Path, given: Sequence[Path] = ()) -> Path:
    """The bundle's `role` file on this host: in the unpacked bundle (`release_dir`; schema 1 bundles and
    TensorRT's Q/DQ model), else a `given` file with its sha256, else the build store (checked)."""
    for a in manifest.artifacts:
        if a.role == role:
            return release_dir / a.path
    hf = next((h for h in manifest.host_files if h.role == role), None)
    if hf is None:
        raise InputError(f"bundle {manifest.model.name} has no {role} file")
    for path in given:
        if _sha(path) == hf.sha256:
            _copy_in(path, hf.sha256)  # found again (or the stored copy was bad): next time the store has it
            return path
    path = stored_path(hf.sha256)
    if not path.is_file():
        raise _missing(manifest, hf, f"is not in the build store {build_store_dir()}")
    if sha256_file(path) != hf.sha256:
        raise _missing(manifest, hf, f"is corrupt in the build store ({path}: sha256 differs)")
    return path


def check_given(manifest: Manifest, given: Sequence[Path], roles: Iterable[str] | None = None) -> None:
    """Fail fast, before any work: each given file must be one the manifest names (by sha256), and each
    host file in `roles` (default: all) must be in the store or given."""
    names = {h.sha256: h for h in manifest.host_files}
    known = set(names) | {a.sha256 for a in manifest.artifacts}
    shas = set()
    for path in given:
        sha = _sha(path)
        if sha not in known:
            listed = ", ".join(f"{h.name} {h.sha256[:16]}…" for h in manifest.host_files) or "none"
            raise InputError(
                f"--source {path} (sha256 {sha[:16]}…) is not a file bundle {manifest.model.name} was built from",
                hint=f"its host files: {listed}",
            )
        shas.add(sha)
    wanted = set(roles) if roles is not None else {h.role for h in manifest.host_files}
    for hf in manifest.host_files:
        if hf.role in wanted and hf.sha256 not in shas and not stored_path(hf.sha256).is_file():
            raise _missing(manifest, hf, f"is not in the build store {build_store_dir()}")


def missing(manifest: Manifest) -> list[HostFile]:
    """The manifest's host files this host's store lacks."""
    return [h for h in manifest.host_files if not stored_path(h.sha256).is_file()]


def _missing(manifest: Manifest, hf: HostFile, why: str) -> HostFileMissing:
    return HostFileMissing(
        f"{hf.name} ({hf.role}, sha256 {hf.sha256[:16]}…) of bundle {manifest.model.name} {why}",
        hint="pass the file: --source PATH (checked by sha256), or rebuild the bundle on this host",
    )


def _sha(path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as e:
        raise InputError(f"--source {path}: {e.strerror}") from None
