"""The systemd units shipped with the agent (systemd/), rendered for one device: the inference service, the
watch service (pull rollouts), the restart path unit with its oneshot (restarts without sudo), and the finisher
with its timer (a deploy cut off with its host is finished on the device).

A model slot besides `default` is served by an instance of a template unit (edgedeploy-agent@SLOT.service,
restarted without sudo through edgedeploy-agent-restart@SLOT.path): the templates are rendered from the
shipped default units line by line (SLOT_TEMPLATES), so they keep the same user and hardening.

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

from .names import DEFAULT_SLOT

UNIT_NAME = "edgedeploy-agent.service"
WATCH_UNIT = "edgedeploy-agent-watch.service"
RESTART_PATH_UNIT = "edgedeploy-agent-restart.path"
RESTART_UNIT = "edgedeploy-agent-restart.service"
RESTART_REQUEST = "run/restart-request"  # under the agent root; the path unit watches it
FINISH_UNIT = "edgedeploy-agent-finish.service"  # finishes a transition cut off with its host (recover --finish)
FINISH_TIMER = "edgedeploy-agent-finish.timer"
# what every systemd install has beside the inference unit: restarts without sudo, and the finisher that uses them
HELPER_UNITS = (RESTART_UNIT, RESTART_PATH_UNIT, FINISH_UNIT, FINISH_TIMER)
# templates for the model slots besides `default`: each made from the shipped unit it names (render_unit)
SLOT_UNIT = "edgedeploy-agent@.service"
SLOT_RESTART_UNIT = "edgedeploy-agent-restart@.service"
SLOT_RESTART_PATH_UNIT = "edgedeploy-agent-restart@.path"
SLOT_TEMPLATES = {SLOT_UNIT: UNIT_NAME, SLOT_RESTART_UNIT: RESTART_UNIT, SLOT_RESTART_PATH_UNIT: RESTART_PATH_UNIT}
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


def instance(template: str, slot: str) -> str:
    """The unit of a template (SLOT_TEMPLATES) that serves model slot `slot` (a slot name needs no escaping)."""
    return template.replace("@.", f"@{slot}.")


def slot_unit(slot: str) -> str:
    """The unit that serves model slot `slot` unless agent.json names another: the default unit for `default`."""
    return UNIT_NAME if slot == DEFAULT_SLOT else instance(SLOT_UNIT, slot)


def restart_request(slot: str) -> str:
    """The restart request of model slot `slot`'s unit, under the agent root (its path unit watches it)."""
    return RESTART_REQUEST if slot == DEFAULT_SLOT else f"models/{slot}/{RESTART_REQUEST}"


def restart_path_unit(slot: str) -> str:
    return RESTART_PATH_UNIT if slot == DEFAULT_SLOT else instance(SLOT_RESTART_PATH_UNIT, slot)


def restart_request_path(root: str, slot: str = DEFAULT_SLOT) -> str:
    """The file the restart path unit watches (`slot` may be the specifier %i, in a template); path settings take
    no quotes: a root that needs them is refused."""
    path = root.rstrip("/") + "/" + RESTART_REQUEST
    if not _PLAIN.fullmatch(path):
        raise ValueError(f"agent root {root!r} holds characters a path unit cannot carry (spaces, '%', ...)")
    return root.rstrip("/") + "/" + restart_request(slot)


def unit_template(name: str = UNIT_NAME) -> str:
    return files("edgedeploy_agent").joinpath("systemd").joinpath(name).read_text(encoding="utf-8")


def _as_template(line: str, key: str) -> str:
    """One line of a shipped default unit as the line of its slot template (the slot is the instance, %i)."""
    if key == "Description":
        return f"{line} (model slot %i)"
    if key == "Unit":  # the path unit's oneshot
        return f"Unit={instance(SLOT_RESTART_UNIT, '%i')}"
    if key == "ExecStart":  # the restart oneshot's fixed command lines, about the slot's unit
        return line.replace(UNIT_NAME, instance(SLOT_UNIT, "%i"))
    return line


def render_unit(
    exec_start: Optional[Sequence[str]] = None,
    user: str = DEFAULT_USER,
    root: str = DEFAULT_ROOT,
    name: str = UNIT_NAME,
) -> str:
    """The shipped unit `name` with this device's command line (an argv list), service user and state folder.

    The restart oneshot has fixed command lines (it restarts UNIT_NAME only): `exec_start` is for the two
    agent services. A slot template (SLOT_TEMPLATES) is its default unit's lines for the slot `%i`: the agent's
    command line gets `--model %i`, the restart units restart and watch that slot's."""
    if not _USER.fullmatch(user):
        raise ValueError(f"service user {user!r} is not a portable user name (letters, digits, '_', '.', '-')")
    base = SLOT_TEMPLATES.get(name, name)
    command = exec_command(exec_start) if exec_start else ""
    if exec_start and base == RESTART_UNIT:
        raise ValueError(f"{name} runs fixed command lines only")
    slot = "%i" if name in SLOT_TEMPLATES else DEFAULT_SLOT
    if command and slot != DEFAULT_SLOT:
        command += " --model %i"
    out = [f"# {name}: {base} for one model slot besides default (the instance, %i)"] if base != name else []
    for line in unit_template(base).splitlines():
        key = line.split("=", 1)[0]
        if base != name:
            line = _as_template(line, key)
        if key == "ExecStart" and command:
            line = f"ExecStart={command}"
        elif key in ("User", "Group"):
            line = f"{key}={user}"
        elif key == "PathChanged":
            line = f"PathChanged={restart_request_path(root, slot)}"
        elif key == "ReadWritePaths":
            line = f"ReadWritePaths={unit_word(root, 'agent root')}"
        elif key in ("StateDirectory", "StateDirectoryMode") and root != DEFAULT_ROOT:
            continue  # systemd creates /var/lib/<name> only; another root is created by the installer
        out.append(line)
    return "\n".join(out) + "\n"
