"""The systemd unit shipped with the agent (systemd/edgedeploy-agent.service), rendered for one device."""

from importlib.resources import files
from typing import Optional

UNIT_NAME = "edgedeploy-agent.service"
DEFAULT_ROOT = "/var/lib/edgedeploy"
DEFAULT_USER = "edgedeploy"


def unit_template() -> str:
    return files("edgedeploy_agent").joinpath("systemd").joinpath(UNIT_NAME).read_text(encoding="utf-8")


def render_unit(exec_start: Optional[str] = None, user: str = DEFAULT_USER, root: str = DEFAULT_ROOT) -> str:
    """The shipped unit with this device's command line, service user and state folder."""
    out = []
    for line in unit_template().splitlines():
        key = line.split("=", 1)[0]
        if key == "ExecStart" and exec_start:
            line = f"ExecStart={exec_start}"
        elif key in ("User", "Group"):
            line = f"{key}={user}"
        elif key == "ReadWritePaths":
            line = f"ReadWritePaths={root}"
        elif key in ("StateDirectory", "StateDirectoryMode") and root != DEFAULT_ROOT:
            continue  # systemd creates /var/lib/<name> only; another root is created by the installer
        out.append(line)
    return "\n".join(out) + "\n"
