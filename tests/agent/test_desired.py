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
from edgedeploy_agent.desired import (
    MAX_MESSAGE_BYTES,
    MAX_MESSAGE_CHARS,
    DesiredRefused,
    MessageError,
    desired_topic,
    json_depth_exceeds,
    parse_message,
    parse_status,
    rollout_trust,
    split_slot_key,
    status_doc,
    status_topic,
    verify_desired,
)
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


# --- every message from the network: bounded, an object, a typed model (issue 40 items 1, 2, 7) --------------

HOSTILE = {
    "deep list": b"[" * 100000,  # past the size limit
    "deep list within the size limit": b"[" * 60000 + b"]" * 60000,
    "deep object": b'{"a":' * 5000 + b"1" + b"}" * 5000,
    "a list": b"[1, 2]",
    "a string": b'"text"',
    "a number": b"7",
    "null": b"null",
    "a huge string": b'{"doc": "' + b"x" * (1 << 20) + b'"}',
    "not UTF-8": b'{"doc": "\xff\xfe"}',
    "not JSON": b"{",
}


@pytest.mark.parametrize("payload", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_desired_messages_are_refused_never_raised(
    pinned: tuple[TrustStore, Ed25519PrivateKey], payload: bytes
) -> None:
    trust, _ = pinned
    with pytest.raises(DesiredRefused, match="malformed") as e:
        verify_desired(payload, "cam-01", trust, None)
    assert e.value.serial is None


def test_depth_is_checked_before_parsing_and_strings_do_not_count() -> None:
    assert json_depth_exceeds(b"[" * 17 + b"]" * 17, 16) and not json_depth_exceeds(b"[" * 16 + b"]" * 16, 16)
    assert not json_depth_exceeds(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"[[[[[["}', 2)
    assert parse_message(b'{"a": "' + b"[" * 40 + b'"}') == {"a": "[" * 40}
    with pytest.raises(MessageError, match="deeper than 16"):
        parse_message(b"[" * 60000)  # json.loads itself would raise RecursionError here
    with pytest.raises(MessageError, match="not an object"):
        parse_message(b"[1, 2]")
    with pytest.raises(MessageError, match="bytes"):
        parse_message(b" " * (MAX_MESSAGE_BYTES + 1))


def test_a_refusal_names_the_serial_it_refuses(pinned: tuple[TrustStore, Ed25519PrivateKey]) -> None:
    trust, key = pinned
    for payload, serial in (
        (message(key, serial=9), 9),  # below the floor
        (message(key, serial=12, expires=(NOW - dt.timedelta(seconds=1)).isoformat()), 12),
        (message(key, serial=13).replace(b"mnist-8-x", b"mnist-9-x"), 13),  # signature does not match
        (message(key, serial=14, extra="x"), 14),  # malformed, but it says which serial it is
        (message(Ed25519PrivateKey.generate(), serial=15), 15),
    ):
        with pytest.raises(DesiredRefused) as e:
            verify_desired(payload, "cam-01", trust, serial_floor=10)
        assert e.value.serial == serial, e.value.message


def test_status_messages_are_read_into_the_typed_model() -> None:
    good = status_doc("cam-01", "downloading", release="r", serial=3, floor=2, progress={"bytes": 1, "total": 9})
    st = parse_status(good, "cam-01")
    assert (st.state, st.serial, st.floor, st.progress and st.progress.total) == ("downloading", 3, 2, 9)
    assert parse_status(status_doc("cam-01", "idle", future_field={"x": 1}), "cam-01").state == "idle"
    bad = [
        *HOSTILE.values(),
        status_doc("cam-02", "idle"),  # another device's name on this device's topic
        b'{"device": "cam-01", "state": "on fire"}',
        b'{"device": "cam-01", "state": "idle", "serial": "7"}',
        b'{"device": "cam-01", "state": "idle", "serial": -1}',
        b'{"device": "cam-01", "state": "idle", "release": "' + b"r" * 1000 + b'"}',
        b'{"device": "cam-01", "state": "idle", "progress": [1]}',
        b'{"device": "cam/01", "state": "idle"}',
    ]
    for payload in bad:
        with pytest.raises(MessageError):
            parse_status(payload, "cam-01")


def test_a_status_message_is_cut_to_a_readable_length() -> None:
    st = json.loads(status_doc("cam-01", "refused", message="x" * 100000))
    assert len(st["message"]) == MAX_MESSAGE_CHARS and st["message"].endswith("...")
    parse_status(status_doc("cam-01", "refused", message="x" * 100000), "cam-01")


def test_a_document_names_its_model_slot_and_one_without_it_is_about_default(
    pinned: tuple[TrustStore, Ed25519PrivateKey],
) -> None:
    """A message as before model slots (no `model`) stays valid and addresses `default`; a document about
    `default` is sent without the key, so it reads as before; a slot name that is not one is refused."""
    from edgedeploy_agent.desired import DesiredDoc

    trust, key = pinned
    old = verify_desired(message(key), "cam-01", trust, serial_floor=10)
    assert old is not None and old.model == "default" and "model" not in old.wire()
    doc = verify_desired(message(key, model="cam2"), "cam-01", trust, serial_floor=10, model="cam2")
    assert doc is not None and doc.model == "cam2" and doc.wire()["model"] == "cam2"
    assert DesiredDoc.model_validate(doc.wire()) == doc
    for bad in ("../x", "Cam2", ""):
        with pytest.raises(DesiredRefused, match="malformed"):
            verify_desired(message(key, model=bad), "cam-01", trust, serial_floor=10)


def test_each_model_slot_has_its_own_topics_and_a_document_must_be_about_its_topics_slot(
    pinned: tuple[TrustStore, Ed25519PrivateKey],
) -> None:
    """`default` keeps the topics from before slots; another slot's are one level down, so each slot's desired
    state is retained on its own. A document (or a status) about one slot on another slot's topic is refused."""
    assert (desired_topic("cam-01"), status_topic("cam-01")) == (
        "edgedeploy/v1/desired/cam-01",
        "edgedeploy/v1/status/cam-01",
    )
    assert desired_topic("cam-01", "cam2") == "edgedeploy/v1/desired/cam-01/cam2"
    assert status_topic("cam-01", "cam2") == "edgedeploy/v1/status/cam-01/cam2"
    assert split_slot_key("cam-01") == ("cam-01", "default") and split_slot_key("cam-01/cam2") == ("cam-01", "cam2")
    for bad in ("cam-01/default", "cam-01/Cam2", "cam-01/", "cam/01/x", "cam-01/a/b", "+", "cam-01/#"):
        assert split_slot_key(bad) is None, bad
    trust, key = pinned
    for doc_model, topic_model in (("cam2", "default"), ("default", "cam2"), ("cam2", "cam3")):
        over = {} if doc_model == "default" else {"model": doc_model}
        with pytest.raises(DesiredRefused, match=f"about model {doc_model}, on the topic of model {topic_model}"):
            verify_desired(message(key, **over), "cam-01", trust, serial_floor=10, model=topic_model)
    about_cam2 = status_doc("cam-01", "idle", model="cam2")
    assert parse_status(about_cam2, "cam-01", "cam2").model == "cam2"
    for payload, model in ((about_cam2, "cam3"), (status_doc("cam-01", "idle"), "cam2")):
        with pytest.raises(MessageError, match="on the topic of model"):
            parse_status(payload, "cam-01", model)
