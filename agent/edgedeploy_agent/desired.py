"""Desired state and status over MQTT: the two documents, their topics, and the device-side checks.

edgedeploy/v1/desired/<device>  retained, written only by the controller: {"doc": {...}, "sig": {...}}
                                 `sig` is ed25519 over canonical_json(doc) by a rollout key the device
                                 pins (ROOT/trust/rollout/<key id>.pub). An empty message: no instruction.
edgedeploy/v1/status/<device>   retained, written only by the device (the broker's ACL enforces both)

Each model slot besides `default` has its own pair, one level down (slot_key):
edgedeploy/v1/desired/<device>/<slot>, edgedeploy/v1/status/<device>/<slot>. So every slot's desired state is
retained on its own (a document for one slot never replaces another's), with its own serials; the topics of
`default` are those from before slots, which an agent from then still reads. The device's last will
("offline") is on its own status topic only: MQTT takes one will per connection.

The device refuses a desired document that is not signed by a pinned rollout key, names another
device, is about another model slot than its topic's, has expired, or carries a serial below the highest
it has acted on for that slot.

Both sides read every message from the network the same way (`parse_message`): at most
MAX_MESSAGE_BYTES, nested at most MAX_DEPTH deep (checked by a scan *before* json.loads, which would
recurse until RecursionError), a JSON object, then a typed model (DesiredDoc, StatusDoc). Anything else is
refused with a MessageError (a ValueError): the device refuses the document, the controller marks that one
device `unreadable`.
"""

import base64
import binascii
import datetime as _dt
import json
import re
from typing import Any, Literal, Optional, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .bundle import canonical_json
from .errors import AgentError
from .names import DEFAULT_SLOT, DEVICE_NAME_PATTERN, SLOT_NAME_PATTERN, is_device_name, is_slot_name
from .trust import TrustStore

TOPIC_ROOT = "edgedeploy/v1"
State = Literal["idle", "downloading", "verifying", "activating", "committed", "rolled-back", "refused", "offline"]
STATES = get_args(State)
TERMINAL = ("committed", "rolled-back", "refused")

MAX_MESSAGE_BYTES = 64 << 10  # a desired document is ~1 KiB, a status a few hundred bytes
MAX_DEPTH = 16  # a desired document nests 3 deep, a status 2
MAX_SERIAL = (1 << 63) - 1
MAX_MESSAGE_CHARS = 2000  # a status's `message` (an error text) is cut to this before it is sent


class MessageError(ValueError):
    """A message from the network that is too large, too deep, not JSON, not an object or not the model."""


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def json_depth_exceeds(data: bytes, limit: int) -> bool:
    """True when the JSON text nests deeper than `limit` (brackets inside strings do not count). A text
    that is not JSON may be judged either way; json.loads refuses it next."""
    depth = 0
    for c in _NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", data)):
        if c in b"[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def parse_message(payload: bytes, max_bytes: int = MAX_MESSAGE_BYTES, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """A JSON object from the network, bounded in size and depth; MessageError for anything else."""
    if len(payload) > max_bytes:
        raise MessageError(f"message of {len(payload)} bytes (at most {max_bytes})")
    if json_depth_exceeds(payload, max_depth):
        raise MessageError(f"message nested deeper than {max_depth} levels")
    try:
        data = json.loads(payload)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise MessageError(f"message is not JSON: {str(e).splitlines()[0][:200]}") from None
    if not isinstance(data, dict):
        raise MessageError(f"message is a JSON {type(data).__name__}, not an object")
    return data


def slot_key(device: str, model: str = DEFAULT_SLOT) -> str:
    """A device's model slot as topic levels: the device for `default` (its topics from before slots),
    DEVICE/SLOT for another. The controller keys its retained statuses and serials by it too."""
    return device if model == DEFAULT_SLOT else f"{device}/{model}"


def split_slot_key(key: str) -> Optional[tuple[str, str]]:
    """Pure: (device, slot) of a slot_key, or None for levels that name no device's slot."""
    device, sep, model = key.partition("/")
    if not is_device_name(device) or (sep and (model == DEFAULT_SLOT or not is_slot_name(model))):
        return None
    return device, model if sep else DEFAULT_SLOT


def desired_topic(device: str, model: str = DEFAULT_SLOT) -> str:
    return f"{TOPIC_ROOT}/desired/{slot_key(device, model)}"


def status_topic(device: str, model: str = DEFAULT_SLOT) -> str:
    return f"{TOPIC_ROOT}/status/{slot_key(device, model)}"


class DesiredRefused(AgentError):
    """A desired-state document this device must not act on; `serial`: the serial it claims, when it names
    one (the refusal status carries it, so the controller waiting for that serial learns the reason)."""

    code = "desired-refused"
    exit_code = 14  # 10 is a refused bundle (errors.UntrustedBundle)

    def __init__(self, message: str, hint: Optional[str] = None, serial: Optional[int] = None) -> None:
        super().__init__(message, hint)
        self.serial = serial


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
    # deploy: pull `ref` and deploy it. rollback: go back to `release`, which this device kept as the
    # release before its current one (or runs already); no download, `ref` is empty
    action: Literal["deploy", "rollback"] = "deploy"
    ref: str  # HOST[:PORT]/REPO@sha256:<digest of the OCI manifest>
    release: str  # the release name the bundle unpacks to (for status and the planner)
    rollout: str
    wave: int = Field(ge=0)
    # per device, above the highest the device reports having acted on and the one the broker holds
    # for it (docs/fleet.md, "Serials"): no host's clock is involved
    serial: int = Field(ge=0, le=MAX_SERIAL)
    issued: _dt.datetime
    expires: _dt.datetime
    jitter_s: float = Field(default=0.0, ge=0, le=3600)  # spread downloads over this many seconds
    health: DesiredHealth = DesiredHealth()
    # the model slot this document is about; a document without it (as before slots) is about `default`
    model: str = Field(default=DEFAULT_SLOT, pattern=SLOT_NAME_PATTERN)

    def wire(self) -> dict[str, Any]:
        """The document as signed and sent: one about `default` leaves `model` out, so it reads as before
        slots (an agent from then accepts it)."""
        data = self.model_dump(mode="json")
        if data["model"] == DEFAULT_SLOT:
            del data["model"]
        return data

    def body(self) -> bytes:
        return canonical_json(self.wire())


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
    model: str = DEFAULT_SLOT,
) -> Optional[DesiredDoc]:
    """The verified document from the desired topic of model slot `model`, or None for an empty message;
    DesiredRefused for anything not acceptable."""
    if not payload:
        return None
    claimed: Optional[int] = None
    try:
        outer = parse_message(payload)
        doc_data, sig = outer["doc"], outer["sig"]
        if isinstance(doc_data, dict) and type(doc_data.get("serial")) is int:
            claimed = doc_data["serial"]
        kid, raw_sig = str(sig["key"]), base64.b64decode(sig["ed25519"], validate=True)
        doc = DesiredDoc.model_validate(doc_data)
    except (ValueError, KeyError, TypeError, binascii.Error, ValidationError) as e:  # MessageError: ValueError
        raise DesiredRefused(
            f"desired-state message is malformed: {str(e).splitlines()[0][:200]}", serial=claimed
        ) from None
    keys = trust.keys()
    if not keys:
        raise DesiredRefused(
            "no rollout key is pinned on this device",
            hint="edgedeploy-agent watch-config --rollout-key",
            serial=claimed,
        )
    if kid not in keys:
        raise DesiredRefused(
            f"desired state signed by key {kid[:80]}, which this device does not pin as a rollout key", serial=claimed
        )
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(keys[kid]).verify(raw_sig, canonical_json(doc_data))
    except InvalidSignature:
        raise DesiredRefused(f"desired-state signature by key {kid} does not match", serial=claimed) from None
    if doc.device != device:
        raise DesiredRefused(f"desired state is for device {doc.device[:80]!r}, this is {device!r}", serial=claimed)
    if doc.model != model:
        raise DesiredRefused(f"desired state is about model {doc.model}, on the topic of model {model}", serial=claimed)
    now = now or _dt.datetime.now(_dt.timezone.utc)
    expires = doc.expires if doc.expires.tzinfo else doc.expires.replace(tzinfo=_dt.timezone.utc)
    if expires <= now:
        raise DesiredRefused(
            f"desired state of rollout {doc.rollout} expired at {expires.isoformat()}", serial=doc.serial
        )
    if serial_floor is not None and doc.serial < serial_floor:
        raise DesiredRefused(
            f"desired state has serial {doc.serial}; this device already acted on {serial_floor}", serial=doc.serial
        )
    return doc


class Progress(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    bytes: int = Field(ge=0)
    total: Optional[int] = Field(default=None, ge=0)


class StatusDoc(BaseModel):
    """A device's status as the controller reads it (what status_doc writes). Fields it does not know are
    dropped (a newer agent may add some); a field of the wrong type or size makes the message unreadable."""

    model_config = ConfigDict(extra="ignore", strict=True)

    device: str = Field(pattern=DEVICE_NAME_PATTERN)
    state: State
    updated: Optional[str] = Field(default=None, max_length=64)
    release: Optional[str] = Field(default=None, max_length=256)
    rollout: Optional[str] = Field(default=None, max_length=256)
    ref: Optional[str] = Field(default=None, max_length=1024)
    serial: Optional[int] = Field(default=None, ge=0, le=MAX_SERIAL)  # the document this status is about
    floor: Optional[int] = Field(default=None, ge=0, le=MAX_SERIAL)  # the highest serial the device acted on
    wave: Optional[int] = Field(default=None, ge=0)
    code: Optional[str] = Field(default=None, max_length=64)
    message: Optional[str] = Field(default=None, max_length=4 * MAX_MESSAGE_CHARS)
    outcome: Optional[str] = Field(default=None, max_length=64)
    progress: Optional[Progress] = None
    model: Optional[str] = Field(default=None, max_length=64)  # the model slot this status is about (None: default)
    # every model slot's current release, on a device with more than one
    models: Optional[dict[str, Optional[str]]] = Field(default=None, max_length=64)


def parse_status(payload: bytes, device: str, model: str = DEFAULT_SLOT) -> StatusDoc:
    """A status message from the status topic of `device`'s model slot `model`: bounded, typed, naming that
    device (and, on a slot's own topic, that slot); MessageError."""
    data = parse_message(payload)
    try:
        status = StatusDoc.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "message"
        raise MessageError(f"status field {where[:64]}: {err['msg'][:200]}") from None
    if status.device != device:
        raise MessageError(f"status on the topic of {device!r} names device {status.device!r}")
    if model != DEFAULT_SLOT and status.model != model:
        raise MessageError(f"status on the topic of model {model!r} is about model {status.model!r}")
    return status


def status_doc(device: str, state: str, **fields: Any) -> bytes:
    """One status message (retained); `state` is one of STATES; a long `message` is cut."""
    if state not in STATES:
        raise ValueError(f"unknown status state {state}")
    if isinstance(fields.get("message"), str) and len(fields["message"]) > MAX_MESSAGE_CHARS:
        fields["message"] = fields["message"][: MAX_MESSAGE_CHARS - 3] + "..."
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")
    return canonical_json({"device": device, "state": state, "updated": now, **fields})
