"""Fleet signing keys (ed25519) and signing a bundle: serial, expiry, `manifest.sig`.

CONFIG/keys/<name>.key   private key (PKCS#8 PEM, mode 0600): keep it on the signing machine
CONFIG/keys/<name>.pub   public key, `ed25519:<base64>`: what devices pin
CONFIG/keys/serial       the last serial this host signed (serials only grow)

Reading public keys needs no crypto library: cryptography is imported by the functions that make or use a
private key.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tomllib

from edgedeploy_agent.bundle import Manifest, canonical_json, extract_bundle, write_bundle
from edgedeploy_agent.durable import write_atomic
from edgedeploy_agent.trust import KEY_PREFIX, key_id, parse_public_key

from .errors import InputError, agent_input
from .paths import config_dir

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def keys_dir() -> Path:
    return config_dir() / "keys"


@dataclass(frozen=True)
class SigningKey:
    name: str
    key_id: str
    public: str  # ed25519:<base64>
    has_private: bool


def generate_key(name: str, force: bool = False) -> SigningKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if not _NAME.match(name):
        raise InputError(f"invalid key name {name!r}", hint="letters, digits, '.', '_', '-'")
    d = keys_dir()
    d.mkdir(parents=True, exist_ok=True)
    priv_path, pub_path = d / f"{name}.key", d / f"{name}.pub"
    if (priv_path.exists() or pub_path.exists()) and not force:
        raise InputError(f"key {name} already exists in {d}", hint="pick another name (or --force to overwrite)")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    write_atomic(priv_path, pem, mode=0o600)
    raw = _public_raw(key)
    write_atomic(pub_path, KEY_PREFIX + base64.b64encode(raw).decode() + "\n")
    return SigningKey(name, key_id(raw), pub_path.read_text().strip(), True)


def list_keys() -> list[SigningKey]:
    d = keys_dir()
    out = []
    for pub in sorted(d.glob("*.pub")) if d.is_dir() else []:
        text = pub.read_text(encoding="ascii").strip()
        with agent_input(pub):
            raw = parse_public_key(text)
        out.append(SigningKey(pub.stem, key_id(raw), text, pub.with_suffix(".key").is_file()))
    return out


def fleet_public_keys() -> list[str]:
    """Every bundle-signing public key in the keys folder: what enrolment pins on a device (current + next).

    The rollout key named in CONFIG/fleet.toml signs desired state, not bundles: it is left out, so a
    device never accepts a bundle signed with it."""
    rollout = None
    try:
        rollout = tomllib.loads((config_dir() / "fleet.toml").read_text(encoding="utf-8")).get("rollout", {}).get("key")
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        pass
    return [k.public for k in list_keys() if k.name != rollout]


def _load_private(name: str) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = keys_dir() / f"{name}.key"
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise InputError(f"no private key {name} in {keys_dir()}", hint="`edgedeploy keys list` shows them") from None
    except ValueError as e:
        raise InputError(f"{path} is not a readable private key: {e}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"{path} is not an ed25519 key")
    return key


def _public_raw(key: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def next_serial(explicit: int | None = None) -> int:
    """One more than the last serial signed here, and at least the Unix time; recorded on use."""
    state = keys_dir() / "serial"
    try:
        last = int(state.read_text(encoding="ascii")) if state.is_file() else 0
    except ValueError:
        raise InputError(
            f"{state} does not hold a serial number",
            hint="write the last serial signed here into it (or remove it: serials then start from the Unix time)",
        ) from None
    serial = explicit if explicit is not None else max(last + 1, int(time.time()))
    state.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(state, f"{max(serial, last)}\n")
    return serial


def sign_manifest(manifest: Manifest, key_name: str) -> bytes:
    """The `manifest.sig` member for `manifest` (which already carries its serial and expiry)."""
    key = _load_private(key_name)
    sig = key.sign(manifest.canonical_bytes())
    return canonical_json({"key": key_id(_public_raw(key)), "ed25519": base64.b64encode(sig).decode()})


def sign_bundle(
    bundle: Path, key_name: str, out: Path, expires_days: float = 90.0, serial: int | None = None
) -> Manifest:
    """Write a signed copy of `bundle`: new serial and expiry in the manifest, then `manifest.sig`."""
    key = _load_private(key_name)  # fail before any work if the key is missing
    del key
    with tempfile.TemporaryDirectory(prefix="edgedeploy-sign-") as tmp:
        with agent_input():
            manifest = extract_bundle(bundle, Path(tmp) / "b")  # verifies every artifact hash
        expires = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(days=expires_days)
        signed = manifest.model_copy(update={"serial": next_serial(serial), "expires": expires})
        files = {a.path: Path(tmp) / "b" / a.path for a in signed.artifacts}
        write_bundle(out, signed, files, signature=sign_manifest(signed, key_name))
    return signed


def sign_document(body: bytes, key_name: str) -> dict[str, str]:
    """{"key", "ed25519"} over `body` (canonical JSON): how desired-state documents are signed."""
    key = _load_private(key_name)
    return {"key": key_id(_public_raw(key)), "ed25519": base64.b64encode(key.sign(body)).decode()}
