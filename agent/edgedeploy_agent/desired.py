"""Desired state and status over MQTT: the two documents, their topics, and the device-side checks.

edgedeploy/v1/desired/<device>  retained, written only by the controller: {"doc": {...}, "sig": {...}}
                                 `sig` is ed25519 over canonical_json(doc) by a rollout key the device
                                 pins (ROOT/trust/rollout/<key id>.pub). An empty message: no instruction.
edgedeploy/v1/status/<device>   retained, written only by the device (the broker's ACL enforces both)

The device refuses a desired document that is not signed by a pinned rollout key, names another
device, has expired, or carries a serial below the highest it has acted on.
"""

import base64
import binascii
import datetime as _dt
import json
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .bundle import canonical_json
from .errors import AgentError
from .trust import TrustStore

TOPIC_ROOT = "edgedeploy/v1"
STATES = ("idle", "downloading", "verifying", "activating", "committed", "rolled-back", "refused", "offline")
TERMINAL = ("committed", "rolled-back", "refused")


def desired_topic(device: str) -> str:
    return f"{TOPIC_ROOT}/desired/{device}"


def status_topic(device: str) -> str:
    return f"{TOPIC_ROOT}/status/{device}"


class DesiredRefused(AgentError):
    """A desired-state document this device must not act on."""

    code = "desired-refused"
    exit_code = 14  # 10 is a refused bundle (errors.UntrustedBundle)


class DesiredHealth(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(default=60.0, gt=0)
    min_inferences: int = Field(default=0, ge=0)
    max_p95_ms: Optional[float] = None
    min_fps: Optional[float] = None


class DesiredDoc(BaseModel):
    """What the controller wants one device to run."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = 1
    device: str
    ref: str  # HOST[:PORT]/REPO@sha256:<digest of the OCI manifest>
    release: str  # the release name the bundle unpacks to (for status and the planner)
    rollout: str
    wave: int = Field(ge=0)
    serial: int = Field(ge=0)  # grows with every document the controller signs
    issued: _dt.datetime
    expires: _dt.datetime
    jitter_s: float = Field(default=0.0, ge=0, le=3600)  # spread downloads over this many seconds
    health: DesiredHealth = DesiredHealth()

    def body(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))


def rollout_trust(root: Any) -> TrustStore:
    """The rollout keys pinned on a device: ROOT/trust/rollout/ (bundle keys are ROOT/trust/*.pub)."""
    store = TrustStore(root)
    store.dir = store.dir / "rollout"
    return store


def verify_desired(
    payload: bytes,
    device: str,
    trust: TrustStore,
    serial_floor: Optional[int],
    now: Optional[_dt.datetime] = None,
) -> Optional[DesiredDoc]:
    """The verified document, or None for an empty message; DesiredRefused for anything not acceptable."""
    if not payload:
        return None
    try:
        outer = json.loads(payload)
        doc_data, sig = outer["doc"], outer["sig"]
        kid, raw_sig = str(sig["key"]), base64.b64decode(sig["ed25519"], validate=True)
        doc = DesiredDoc.model_validate(doc_data)
    except (ValueError, KeyError, TypeError, binascii.Error, ValidationError) as e:
        raise DesiredRefused(f"desired-state message is malformed: {str(e).splitlines()[0][:200]}") from None
    keys = trust.keys()
    if not keys:
        raise DesiredRefused(
            "no rollout key is pinned on this device", hint="edgedeploy-agent watch-config --rollout-key"
        )
    if kid not in keys:
        raise DesiredRefused(f"desired state signed by key {kid}, which this device does not pin as a rollout key")
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(keys[kid]).verify(raw_sig, canonical_json(doc_data))
    except InvalidSignature:
        raise DesiredRefused(f"desired-state signature by key {kid} does not match") from None
    if doc.device != device:
        raise DesiredRefused(f"desired state is for device {doc.device!r}, this is {device!r}")
    now = now or _dt.datetime.now(_dt.timezone.utc)
    expires = doc.expires if doc.expires.tzinfo else doc.expires.replace(tzinfo=_dt.timezone.utc)
    if expires <= now:
        raise DesiredRefused(f"desired state of rollout {doc.rollout} expired at {expires.isoformat()}")
    if serial_floor is not None and doc.serial < serial_floor:
        raise DesiredRefused(f"desired state has serial {doc.serial}; this device already acted on {serial_floor}")
    return doc


def status_doc(device: str, state: str, **fields: Any) -> bytes:
    """One status message (retained); `state` is one of STATES."""
    if state not in STATES:
        raise ValueError(f"unknown status state {state}")
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
    return canonical_json({"device": device, "state": state, "updated": now, **fields})
