"""The systemd units shipped with the agent (systemd/), rendered for one device: the inference service, the
watch service (pull rollouts), the restart path unit with its oneshot (restarts without sudo), and the finisher
with its timer (a deploy cut off with its host is finished on the device).

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
WATCH_UNIT = "edgedeploy-agent-watch.service"
RESTART_PATH_UNIT = "edgedeploy-agent-restart.path"
RESTART_UNIT = "edgedeploy-agent-restart.service"
RESTART_REQUEST = "run/restart-request"  # under the agent root; the path unit watches it
FINISH_UNIT = "edgedeploy-agent-finish.service"  # finishes a transition cut off with its host (recover --finish)
FINISH_TIMER = "edgedeploy-agent-finish.timer"
# what every systemd install has beside the inference unit: restarts without sudo, and the finisher that uses them
HELPER_UNITS = (RESTART_UNIT, RESTART_PATH_UNIT, FINISH_UNIT, FINISH_TIMER)
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


def exec_command(argv: Sequence[str]) -> str:
    """An argv list as the value of ExecStart= (each word checked and quoted by unit_word)."""
    exe, *args = argv
    if "$" in exe:  # systemd runs the path as written but expands $ in argv[0]: no spelling serves both
        raise ValueError(f"ExecStart executable {exe!r} holds a '$'")
    return " ".join([unit_word(exe, "ExecStart executable")] + [unit_word(a, "ExecStart argument", True) for a in args])


def restart_request_path(root: str) -> str:
    """The file the restart path unit watches; path settings take no quotes: a root that needs them is refused."""
    path = root.rstrip("/") + "/" + RESTART_REQUEST
    if not _PLAIN.fullmatch(path):
        raise ValueError(f"agent root {root!r} holds characters a path unit cannot carry (spaces, '%', ...)")
    return path


def unit_template(name: str = UNIT_NAME) -> str:
    return files("edgedeploy_agent").joinpath("systemd").joinpath(name).read_text(encoding="utf-8")


def render_unit(
    exec_start: Optional[Sequence[str]] = None,
    user: str = DEFAULT_USER,
    root: str = DEFAULT_ROOT,
    name: str = UNIT_NAME,
) -> str:
    """The shipped unit `name` with this device's command line (an argv list), service user and state folder.

    The restart oneshot has fixed command lines (it restarts UNIT_NAME only): `exec_start` is for the two
    agent services."""
    if not _USER.fullmatch(user):
        raise ValueError(f"service user {user!r} is not a portable user name (letters, digits, '_', '.', '-')")
    command = exec_command(exec_start) if exec_start else ""
    if exec_start and name == RESTART_UNIT:
        raise ValueError(f"{RESTART_UNIT} runs fixed command lines only")
    out = []
    for line in unit_template(name).splitlines():
        key = line.split("=", 1)[0]
        if key == "ExecStart" and command:
            line = f"ExecStart={command}"
        elif key in ("User", "Group"):
            line = f"{key}={user}"
        elif key == "PathChanged":
            line = f"PathChanged={restart_request_path(root)}"
        elif key == "ReadWritePaths":
            line = f"ReadWritePaths={unit_word(root, 'agent root')}"
        elif key in ("StateDirectory", "StateDirectoryMode") and root != DEFAULT_ROOT:
            continue  # systemd creates /var/lib/<name> only; another root is created by the installer
        out.append(line)
    return "\n".join(out) + "\n"
