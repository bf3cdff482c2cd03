"""Device names: the one rule, for the agent and the host (the host's inventory imports it from here).

A device name is an MQTT client id and topic level (`edgedeploy/v1/status/<name>`), a broker user, a file
name on the host and a TOML key in the inventory: letters, digits, `.`, `_` and `-`, starting with a letter
or a digit, at most 63 characters. That leaves out MQTT's wildcards `+` and `#`, the level separator `/`,
spaces, control characters and names long enough to be refused by a broker or a file system.
"""

import re
from collections.abc import Iterable

DEVICE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
DEVICE_NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters"
_DEVICE_NAME = re.compile(DEVICE_NAME_PATTERN)


def is_device_name(name: object) -> bool:
    """True for a valid device name (fullmatch: `$` alone would let a trailing newline through)."""
    return isinstance(name, str) and _DEVICE_NAME.fullmatch(name) is not None


# A model slot (one deployed model on a device: `edgedeploy push --model NAME`) becomes a folder name on the
# device (ROOT/models/NAME), a command-line value and a key in agent.json and the inventory: lower-case letters,
# digits, '_' and '-', starting with a letter or digit, at most 32 characters (no '.', so never '.' or '..').
DEFAULT_SLOT = "default"
SLOT_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
SLOT_NAME_RULE = "lower-case letters, digits, '_' and '-', starting with a letter or digit, at most 32 characters"
_SLOT_NAME = re.compile(SLOT_NAME_PATTERN)


def is_slot_name(name: object) -> bool:
    return isinstance(name, str) and _SLOT_NAME.fullmatch(name) is not None


def check_extra_slots(names: Iterable[str]) -> None:
    """The slots besides `default` that agent.json and the inventory name (their `models`): ValueError for a
    name that is not a slot name, or is `default` (whose fields are the device's own)."""
    for name in names:
        if name == DEFAULT_SLOT or not is_slot_name(name):
            raise ValueError(f"{name[:40]!r} is not a model slot name ({SLOT_NAME_RULE}; not {DEFAULT_SLOT!r})")
