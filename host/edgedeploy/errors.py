"""One error root for the host; each subclass maps to an exit code and carries a hint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import ValidationError

from edgedeploy_agent.errors import AgentError

# The exit codes of `edgedeploy`, one meaning each. DOCUMENTED_EXIT_CODES is the table README.md and
# docs/troubleshooting.md#exit-codes show; tests/host/test_exit_codes.py checks both and every --help against it.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INPUT = 2
EXIT_CONNECTION = 3
EXIT_DEVICE = 4
EXIT_PARTIAL = 5
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

DOCUMENTED_EXIT_CODES = {
    EXIT_OK: "everything asked for was done (on every device of a fleet command)",
    EXIT_FAILED: "the command failed: a build failed (`BuildError`), or every device of a fleet command failed",
    EXIT_INPUT: "bad input: a missing or corrupt file, an unknown name, a malformed option, inventory or card",
    EXIT_CONNECTION: "a device cannot be reached or authenticated (`ConnectionFailed`, `host-key`)",
    EXIT_DEVICE: "a device (or the registry) refused the operation, or a device rolled back (`DeviceError`)",
    EXIT_PARTIAL: "partial: a fleet command where some devices succeeded and others failed or were not reached",
    EXIT_INTERNAL: "internal error, a bug: the traceback is in the state folder's `logs/last-error.log`",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C); a rollout's state is kept, `rollout --resume` continues it",
}


def fleet_exit_code(succeeded: int, total: int) -> int:
    """0 every device ok, 5 some did, 1 none did (or there was no device)."""
    if total and succeeded == total:
        return EXIT_OK
    return EXIT_PARTIAL if succeeded else EXIT_FAILED


class EdgeDeployError(Exception):
    """An error a user can act on: printed as one line plus a hint, never as a traceback."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(EdgeDeployError):
    """Bad input: a missing or corrupt file, an unknown name, a malformed config."""

    exit_code = EXIT_INPUT


class ModelError(InputError):
    """The model file cannot be read or compiled."""


class ProfileError(InputError):
    """Unknown or invalid device profile."""


class InventoryError(InputError):
    """Unknown device or malformed inventory."""


class BuildError(EdgeDeployError):
    """The compiler failed or a required toolchain is missing."""


class ConnectionFailed(EdgeDeployError):
    """The device cannot be reached or authenticated."""

    exit_code = EXIT_CONNECTION


class HostKeyError(ConnectionFailed):
    """The device's host key is unknown or changed."""


class DeviceError(EdgeDeployError):
    """The device refused or failed an operation; `code` is the agent's error code."""

    exit_code = EXIT_DEVICE

    def __init__(self, message: str, hint: str | None = None, code: str = "device-error") -> None:
        super().__init__(message, hint)
        self.code = code


@contextmanager
def agent_input(what: Path | str | None = None) -> Iterator[None]:
    """The one place an AgentError becomes a host error: agent code run on the host (reading a bundle, a
    key, a release) fails on what it was given, which is bad input here (exit 2). `what` prefixes it."""
    try:
        yield
    except AgentError as e:
        raise InputError(f"{what}: {e.message}" if what else e.message, hint=e.hint) from None


TROUBLESHOOTING = "docs/troubleshooting.md"


def error_code(e: EdgeDeployError) -> str:
    """The code fleet results and rollout records give an error: the agent's (or the host's) device error
    code, `host-key`, else the error's class name. Each has a section in docs/troubleshooting.md."""
    if isinstance(e, DeviceError):
        return e.code
    if isinstance(e, HostKeyError):
        return "host-key"
    return type(e).__name__


def hint_with_link(e: EdgeDeployError) -> str | None:
    """The hint the CLI prints: for device and connection errors, with a link to the code's section of the
    troubleshooting catalogue (the codes a technician meets in the field)."""
    if not isinstance(e, DeviceError | ConnectionFailed):
        return e.hint
    link = f"see {TROUBLESHOOTING}#{error_code(e).lower()}"
    return f"{e.hint}; {link}" if e.hint else link


def os_error_text(e: OSError) -> str:
    """One line for a file-system error, naming the path in words a technician acts on."""
    where = e.filename if e.filename is not None else "?"
    if e.filename2 is not None:  # a rename: which side is wrong is only in the reason
        return f"cannot move {where} to {e.filename2}: {e.strerror or e}"
    if isinstance(e, FileExistsError | NotADirectoryError):
        return f"{where} is not a folder (a file of that name is in the way)"
    if isinstance(e, IsADirectoryError):
        return f"{where} is a folder, a file was expected"
    return f"{where}: {e.strerror or e}"


def validation_text(e: ValidationError) -> str:
    """The first problem pydantic found, as `field.path: message` on one line."""
    err = e.errors()[0]
    return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
