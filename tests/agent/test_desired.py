"""Desired-state documents on the device: a good one verifies; every other one is refused with a reason."""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgedeploy_agent.bundle import canonical_json
from edgedeploy_agent.desired import DesiredRefused, rollout_trust, status_doc, verify_desired
from edgedeploy_agent.trust import TrustStore, key_id
from edgedeploy_agent.watch import backoff_delay
from tests.agent.bundles import public

NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
REF = "127.0.0.1:5000/models/mnist@sha256:" + "ab" * 32


def message(key: Ed25519PrivateKey, **over: object) -> bytes:
    doc: dict[str, object] = {
        "schema_version": 1, "device": "cam-01", "ref": REF, "release": "mnist-8-x", "rollout": "r1", "wave": 0,
        "serial": 10, "issued": NOW.isoformat(), "expires": (NOW + dt.timedelta(hours=1)).isoformat(),
        "jitter_s": 0.0, "health": {"timeout_s": 60.0, "min_inferences": 0, "max_p95_ms": None, "min_fps": None},
    }  # fmt: skip
    doc.update(over)
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    sig = {"key": key_id(raw), "ed25519": base64.b64encode(key.sign(canonical_json(doc))).decode()}
    return canonical_json({"doc": doc, "sig": sig})


@pytest.fixture
def pinned(tmp_path: Path) -> tuple[TrustStore, Ed25519PrivateKey]:
    key = Ed25519PrivateKey.generate()
    trust = rollout_trust(tmp_path)
    trust.replace([public(key)])
    return trust, key


def test_a_good_document_verifies_and_an_empty_one_means_no_instruction(
    pinned: tuple[TrustStore, Ed25519PrivateKey],
) -> None:
    trust, key = pinned
    doc = verify_desired(message(key), "cam-01", trust, serial_floor=10)
    assert doc is not None and doc.ref == REF and doc.serial == 10
    assert verify_desired(b"", "cam-01", trust, None) is None


def test_rollout_keys_are_not_bundle_keys(tmp_path: Path, pinned: tuple[TrustStore, Ed25519PrivateKey]) -> None:
    _, key = pinned
    assert TrustStore(tmp_path).keys() == {}  # a bundle key pinned in trust/ does not sign desired state, and back


@pytest.mark.parametrize(
    ("tamper", "words"),
    [
        (lambda key: message(Ed25519PrivateKey.generate()), "does not pin"),
        (lambda key: message(key, device="cam-02"), "is for device 'cam-02'"),
        (lambda key: message(key, expires=(NOW - dt.timedelta(seconds=1)).isoformat()), "expired"),
        (lambda key: message(key, serial=9), "already acted on 10"),
        (lambda key: message(key).replace(b"mnist-8-x", b"mnist-9-x"), "does not match"),
        (lambda key: message(key, extra="x"), "malformed"),
        (lambda key: b"not json", "malformed"),
    ],
)
def test_refusals(pinned: tuple[TrustStore, Ed25519PrivateKey], tamper: object, words: str) -> None:
    trust, key = pinned
    with pytest.raises(DesiredRefused, match=words):
        verify_desired(tamper(key), "cam-01", trust, serial_floor=10)  # type: ignore[operator]


def test_no_pinned_rollout_key_refuses_everything(tmp_path: Path) -> None:
    with pytest.raises(DesiredRefused, match="no rollout key"):
        verify_desired(message(Ed25519PrivateKey.generate()), "cam-01", rollout_trust(tmp_path), None)


def test_status_documents_name_known_states_only() -> None:
    assert json.loads(status_doc("cam-01", "committed", release="r"))["state"] == "committed"
    with pytest.raises(ValueError):
        status_doc("cam-01", "done")


def test_backoff_grows_to_its_ceiling_with_jitter() -> None:
    rng = random.Random(1)
    delays = [[backoff_delay(a, 1.0, 60.0, rng) for a in range(10)] for _ in range(50)]
    for run in delays:
        for a, d in enumerate(run):
            ceiling = min(60.0, 2.0**a)
            assert ceiling / 2 <= d <= ceiling
    assert len({round(run[6], 6) for run in delays}) > 40  # a fleet does not reconnect in lock step


def test_watch_bad_configuration_is_one_line(tmp_path: Path) -> None:
    from tests.helpers import agent

    root = str(tmp_path / "root")
    assert agent("--root", root, "init", "--device-name", "cam-01").code == 0
    r = agent("--root", root, "watch")
    assert r.code == 9 and "watch.json does not exist" in r.err and "Traceback" not in r.err, r.err
    r = agent("--root", root, "watch-config", "--broker", "no-port", "--registry", "http://cache:5000")
    assert r.code == 9 and "broker" in r.err and "Traceback" not in r.err, r.err
    ok = (
        "watch-config",
        "--broker",
        "cache:1883",
        "--registry",
        "http://cache:5000",
        "--password-file",
        "/nonexistent",
    )
    assert agent("--root", root, *ok).code == 0
    r = agent("--root", root, "watch")
    assert r.code == 9 and "password file" in r.err and "Traceback" not in r.err, r.err
