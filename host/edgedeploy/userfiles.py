"""Files a user hands over or points at (inventory, model card, labels): every failure is one InputError."""

from __future__ import annotations

from pathlib import Path

from edgedeploy_agent.durable import write_atomic

from .errors import InputError, os_error_text


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of `path`; `what` names the file in the error (e.g. "inventory")."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {e.start})", hint="save it as UTF-8") from None
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {os_error_text(e)}") from None


def write_text_atomic(path: Path, text: str, what: str, hint: str | None = None) -> None:
    """Write `path` through a temp file and a rename: readers see the old or the new text, never half."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as e:
        raise InputError(f"cannot write {what} {path}: {os_error_text(e)}", hint=hint) from None
