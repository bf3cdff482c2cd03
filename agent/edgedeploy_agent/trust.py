"""Signed bundles on the device: pinned ed25519 keys, signature, serial floor, expiry.

ROOT/trust/<key id>.pub holds one pinned public key each (`ed25519:<base64 of 32 bytes>`). With no
key pinned the device accepts unsigned bundles (a lab device); once one key is pinned every bundle
must carry `manifest.sig` made by a pinned key, over the exact canonical manifest bytes. Several
keys may be pinned at once (the current one and the next one, for rotation).

`manifest.sig` is canonical JSON: {"key": <key id>, "ed25519": <base64 signature>}.
"""

import base64
import binascii
import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from .bundle import Manifest
from .durable import fsync_dir, write_atomic
from .errors import BadSignature, ExpiredBundle, IncompatibleBundle, ReplayedBundle, UnsignedBundle, UntrustedBundle

KEY_PREFIX = "ed25519:"


def parse_public_key(text: str) -> bytes:
    """`ed25519:<base64>` -> the 32 raw key bytes; raises UntrustedBundle on anything else."""
    text = text.strip()
    if not text.startswith(KEY_PREFIX):
        raise UntrustedBundle(f"not an edgedeploy public key (expected {KEY_PREFIX}<base64>): {text[:40]!r}")
    try:
        raw = base64.b64decode(text[len(KEY_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise UntrustedBundle(f"public key is not valid base64: {text[:40]!r}") from None
    if len(raw) != 32:
        raise UntrustedBundle(f"an ed25519 public key has 32 bytes, this one has {len(raw)}")
    return raw


def key_id(raw: bytes) -> str:
    """Short stable name of a public key: 16 hex digits of its sha256."""
    return hashlib.sha256(raw).hexdigest()[:16]


class TrustStore:
    """The public keys pinned on one device (ROOT/trust/)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "trust"

    def keys(self) -> dict[str, bytes]:
        if not self.dir.is_dir():
            return {}
        out = {}
        for p in sorted(self.dir.glob("*.pub")):
            raw = parse_public_key(p.read_text(encoding="ascii"))
            out[key_id(raw)] = raw
        return out

    def replace(self, public_keys: list[str]) -> list[str]:
        """Pin exactly these keys (validated first, so a typo never unpins the fleet)."""
        raws = [parse_public_key(k) for k in public_keys]
        self.dir.mkdir(parents=True, exist_ok=True)
        wanted = {key_id(r): r for r in raws}
        for kid, raw in wanted.items():
            write_atomic(self.dir / f"{kid}.pub", KEY_PREFIX + base64.b64encode(raw).decode() + "\n")
        for p in self.dir.glob("*.pub"):
            if p.stem not in wanted:
                p.unlink()
        fsync_dir(self.dir)
        return sorted(wanted)


def check_trust(
    trust: TrustStore,
    manifest: Manifest,
    body: bytes,
    signature: Optional[bytes],
    serial_floor: Optional[dict[str, Any]],
    profile: Optional[str],
    now: Optional[_dt.datetime] = None,
) -> None:
    """Refuse a bundle this device must not run; called before any artifact byte is used."""
    if profile is not None and manifest.profile != profile:
        raise IncompatibleBundle(
            f"bundle {manifest.model.name} is for profile {manifest.profile}, this device is {profile}",
            hint=f"build the bundle with --profile {profile}",
        )
    keys = trust.keys()
    if not keys:
        return  # no pinned key: this device accepts unsigned bundles
    if signature is None:
        raise UnsignedBundle(
            f"bundle {manifest.release_name} is not signed and this device pins {len(keys)} key(s)",
            hint="sign it with `edgedeploy sign BUNDLE --key NAME`",
        )
    if body != manifest.canonical_bytes():
        raise BadSignature(f"bundle {manifest.release_name}: manifest.json is not in canonical form")
    try:
        sig = json.loads(signature)
        kid, raw_sig = str(sig["key"]), base64.b64decode(sig["ed25519"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise BadSignature(f"bundle {manifest.release_name}: manifest.sig is malformed") from None
    if kid not in keys:
        raise BadSignature(
            f"bundle {manifest.release_name} is signed by key {kid}, which this device does not pin "
            f"(pinned: {', '.join(sorted(keys))})",
            hint="install the fleet's public keys with `edgedeploy keys install DEVICE`",
        )
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(keys[kid]).verify(raw_sig, body)
    except InvalidSignature:
        raise BadSignature(f"bundle {manifest.release_name}: signature by key {kid} does not match") from None
    if manifest.serial is None or manifest.expires is None:
        raise BadSignature(f"bundle {manifest.release_name} is signed but has no serial or expiry")
    now = now or _dt.datetime.now(_dt.timezone.utc)
    expires = manifest.expires if manifest.expires.tzinfo else manifest.expires.replace(tzinfo=_dt.timezone.utc)
    if expires <= now:
        raise ExpiredBundle(
            f"bundle {manifest.release_name} expired at {expires.isoformat()}",
            hint="sign it again with a later expiry",
        )
    if serial_floor:
        floor, floor_id = int(serial_floor["serial"]), serial_floor.get("bundle_id")
        if manifest.serial < floor or (manifest.serial == floor and manifest.bundle_id != floor_id):
            raise ReplayedBundle(
                f"bundle {manifest.release_name} has serial {manifest.serial}; this device already ran serial {floor}",
                hint="sign the bundle again (a new signature gets a higher serial)",
            )
