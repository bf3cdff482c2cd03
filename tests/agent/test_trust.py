"""Signed bundles on the device: every refusal has its own code, and a good signature deploys."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgedeploy_agent.bundle import canonical_json, extract_bundle, read_manifest, write_bundle
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import (
    BadSignature,
    ExpiredBundle,
    IncompatibleBundle,
    ReplayedBundle,
    UnsignedBundle,
    UntrustedBundle,
)
from edgedeploy_agent.lifecycle import Deployment
from edgedeploy_agent.store import DeviceStore
from edgedeploy_agent.trust import TrustStore, key_id
from tests.agent.bundles import copy, make_bundle, public
from tests.agent.doubles import ScriptedService

NOW = dt.datetime.now(dt.timezone.utc)


def signed(
    src: Path,
    out: Path,
    key: Ed25519PrivateKey,
    serial: int,
    expires: dt.datetime = NOW + dt.timedelta(days=1),
    tamper: bool = False,
) -> Path:
    work = out.with_suffix(".d")
    m = extract_bundle(src, work).model_copy(update={"serial": serial, "expires": expires})
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    sig = key.sign(m.canonical_bytes() + (b"x" if tamper else b""))
    member = canonical_json({"key": key_id(raw), "ed25519": base64.b64encode(sig).decode()})
    return write_bundle(out, m, {a.path: work / a.path for a in m.artifacts}, signature=member)


@pytest.fixture
def store(tmp_path: Path) -> DeviceStore:
    s = DeviceStore(tmp_path / "device")
    s.init(AgentConfig(device_name="t", profile="cpu-x86_64"))
    return s


def deploy(store: DeviceStore, bundle: Path) -> dict:
    return Deployment(store, ScriptedService(store)).deploy(copy(bundle, store.incoming), timeout=2)


def test_unpinned_device_accepts_unsigned(store: DeviceStore, tmp_path: Path) -> None:
    assert deploy(store, make_bundle(tmp_path / "a"))["outcome"] == "committed"


def test_every_refusal_and_rotation(store: DeviceStore, tmp_path: Path) -> None:
    current, nxt, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    TrustStore(store.root).replace([public(current), public(nxt)])
    base = make_bundle(tmp_path / "b", version="1")
    cases = [
        (base, UnsignedBundle, "unsigned-bundle"),
        (signed(base, tmp_path / "s1.edb", stranger, 10), BadSignature, "bad-signature"),
        (signed(base, tmp_path / "s2.edb", current, 10, tamper=True), BadSignature, "bad-signature"),
        (signed(base, tmp_path / "s3.edb", current, 10, NOW - dt.timedelta(seconds=1)), ExpiredBundle, "expired"),
    ]
    for bundle, exc, code in cases:
        with pytest.raises(exc) as e:
            deploy(store, bundle)
        assert isinstance(e.value, UntrustedBundle) and e.value.to_dict()["code"].startswith(code)
        assert store.current() is None  # nothing was staged or activated
        assert not list(store.incoming.iterdir())  # and the refused upload is gone
    ok = signed(base, tmp_path / "ok.edb", current, 10)
    assert deploy(store, ok)["outcome"] == "committed"
    assert store.state()["serial"]["serial"] == 10
    with pytest.raises(ReplayedBundle):
        deploy(store, signed(make_bundle(tmp_path / "c", version="0"), tmp_path / "old.edb", current, 9))
    assert not list(store.incoming.iterdir())
    # the next key works before the current one is retired
    v2 = signed(make_bundle(tmp_path / "d", version="2"), tmp_path / "v2.edb", nxt, 11)
    assert deploy(store, v2)["outcome"] == "committed" and store.current() == read_manifest(v2).release_name
    assert (store.release_dir(read_manifest(v2).release_name) / "manifest.sig").is_file()


def test_bundle_for_another_profile_is_refused(store: DeviceStore, tmp_path: Path) -> None:
    with pytest.raises(IncompatibleBundle, match="for profile xavier-agx, this device is cpu-x86_64"):
        deploy(store, make_bundle(tmp_path / "x", profile="xavier-agx"))


def test_pinning_rejects_malformed_keys_and_keeps_the_old_set(store: DeviceStore) -> None:
    key = public(Ed25519PrivateKey.generate())
    trust = TrustStore(store.root)
    trust.replace([key])
    with pytest.raises(UntrustedBundle):
        trust.replace([key, "ed25519:notbase64!"])
    assert len(trust.keys()) == 1
