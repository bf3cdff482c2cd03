"""One error root for the host; each subclass maps to an exit code and carries a hint."""

from __future__ import annotations

from pydantic import ValidationError


class EdgeDeployError(Exception):
    """An error a user can act on: printed as one line plus a hint, never as a traceback."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class InputError(EdgeDeployError):
    """Bad input: a missing or corrupt file, an unknown name, a malformed config."""

    exit_code = 2


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

    exit_code = 3


class HostKeyError(ConnectionFailed):
    """The device's host key is unknown or changed."""


class DeviceError(EdgeDeployError):
    """The device refused or failed an operation; `code` is the agent's error code."""

    exit_code = 4

    def __init__(self, message: str, hint: str | None = None, code: str = "device-error") -> None:
        super().__init__(message, hint)
        self.code = code


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
