"""Device names: the one rule, for the agent and the host (the host's inventory imports it from here).

A device name is an MQTT client id and topic level (`edgedeploy/v1/status/<name>`), a broker user, a file
name on the host and a TOML key in the inventory: letters, digits, `.`, `_` and `-`, starting with a letter
or a digit, at most 63 characters. That leaves out MQTT's wildcards `+` and `#`, the level separator `/`,
spaces, control characters and names long enough to be refused by a broker or a file system.
"""

import re

DEVICE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
DEVICE_NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 63 characters"
_DEVICE_NAME = re.compile(DEVICE_NAME_PATTERN)


def is_device_name(name: object) -> bool:
    """True for a valid device name (fullmatch: `$` alone would let a trailing newline through)."""
    return isinstance(name, str) and _DEVICE_NAME.fullmatch(name) is not None
