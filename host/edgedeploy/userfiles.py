"""Files a user hands over or points at (inventory, model card, profile, labels): every failure is one
InputError."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import tomllib
from pydantic import BaseModel, ValidationError

from edgedeploy_agent.durable import write_atomic

from .errors import InputError, os_error_text, validation_text

M = TypeVar("M", bound=BaseModel)


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


def read_toml(path: Path, what: str, error: type[InputError] = InputError) -> dict[str, Any]:
    """The TOML table in `path`; a syntax error is one `error`: "{what} {path} is not valid TOML: ..."."""
    try:
        table: dict[str, Any] = tomllib.loads(read_text(path, what))
    except tomllib.TOMLDecodeError as e:
        raise error(f"{what} {path} is not valid TOML: {e}") from None
    return table


def read_toml_model(path: Path, what: str, model: type[M], error: type[InputError] = InputError, **extra: Any) -> M:
    """The TOML file `path` (plus `extra` keys) validated as `model`; a wrong field is one `error` that
    names the file and the field: "{what} {path}: FIELD: ..."."""
    try:
        return model.model_validate({**read_toml(path, what, error), **extra})
    except ValidationError as e:
        raise error(f"{what} {path}: {validation_text(e)}") from None


def write_text_atomic(path: Path, text: str, what: str, hint: str | None = None) -> None:
    """Write `path` through a temp file and a rename: readers see the old or the new text, never half."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError as e:
        raise InputError(f"cannot write {what} {path}: {os_error_text(e)}", hint=hint) from None
