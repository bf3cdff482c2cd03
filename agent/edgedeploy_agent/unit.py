"""The systemd unit shipped with the agent (systemd/edgedeploy-agent.service), rendered for one device.

Values from the inventory end up in unit lines, so each is checked and quoted as systemd reads it back
(systemd.syntax(7), systemd.service(5) "Command lines"): a path with spaces is one double-quoted word,
`%` (a specifier) is written `%%`, and `$` in ExecStart= arguments (variable expansion) `$$`. Control characters,
quotes and backslashes are refused rather than escaped: ReadWritePaths= keeps backslashes as they are
(EXTRACT_RETAIN_ESCAPE), so no escaping of them means the same thing in every directive.
"""

import re
from collections.abc import Sequence
from importlib.resources import files
from typing import Optional

UNIT_NAME = "edgedeploy-agent.service"
DEFAULT_ROOT = "/var/lib/edgedeploy"
DEFAULT_USER = "edgedeploy"

_UNSAFE = re.compile(r"[\x00-\x1f\x7f\"'\\]")
_PLAIN = re.compile(r"[A-Za-z0-9/._+:=,@-]+")
# a POSIX portable user name (what useradd accepts by default, plus upper case)
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def unit_word(value: str, what: str, in_exec: bool = False) -> str:
    """`value` as one word of a unit line; ValueError when it holds what a unit file cannot carry safely."""
    if _UNSAFE.search(value):
        raise ValueError(f"{what} {value!r} holds a control character, a quote or a backslash")
    if _PLAIN.fullmatch(value):
        return value
    value = value.replace("%", "%%")
    if in_exec:
        value = value.replace("$", "$$")
    return f'"{value}"'


def unit_template() -> str:
    return files("edgedeploy_agent").joinpath("systemd").joinpath(UNIT_NAME).read_text(encoding="utf-8")


def render_unit(exec_start: Optional[Sequence[str]] = None, user: str = DEFAULT_USER, root: str = DEFAULT_ROOT) -> str:
    """The shipped unit with this device's command line (an argv list), service user and state folder."""
    if not _USER.fullmatch(user):
        raise ValueError(f"service user {user!r} is not a portable user name (letters, digits, '_', '.', '-')")
    command = ""
    if exec_start:
        exe, *args = exec_start
        if "$" in exe:  # systemd runs the path as written but expands $ in argv[0]: no spelling serves both
            raise ValueError(f"ExecStart executable {exe!r} holds a '$'")
        words = [unit_word(exe, "ExecStart executable")] + [unit_word(a, "ExecStart argument", True) for a in args]
        command = " ".join(words)
    out = []
    for line in unit_template().splitlines():
        key = line.split("=", 1)[0]
        if key == "ExecStart" and command:
            line = f"ExecStart={command}"
        elif key in ("User", "Group"):
            line = f"{key}={user}"
        elif key == "ReadWritePaths":
            line = f"ReadWritePaths={unit_word(root, 'agent root')}"
        elif key in ("StateDirectory", "StateDirectoryMode") and root != DEFAULT_ROOT:
            continue  # systemd creates /var/lib/<name> only; another root is created by the installer
        out.append(line)
    return "\n".join(out) + "\n"
