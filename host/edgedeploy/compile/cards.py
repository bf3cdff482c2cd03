"""Model cards: what the model file cannot say (name, version, labels, pre/post-processing, health),
read from TOML, found by the model's sha256, or made up from the file name."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgedeploy_agent.bundle import MODEL_NAME_PATTERN, MODEL_VERSION_PATTERN, HealthSpec, Postprocess, Preprocess

from ..errors import InputError, validation_text
from ..paths import config_dir
from ..userfiles import read_text, read_toml, read_toml_model


class ModelCard(BaseModel):
    """What the model file cannot say: name, version, labels, preprocessing, post-processing."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, pattern=MODEL_NAME_PATTERN)  # checked here, not after the compile
    version: str = Field(default="1", pattern=MODEL_VERSION_PATTERN)
    description: str = ""
    source_sha256: str | None = Field(default=None, description="sha256 of the model file the card describes")
    labels: list[str] | None = None
    labels_file: str | None = Field(default=None, description="path relative to the card, one label per line")
    preprocess: Preprocess = Field(default_factory=Preprocess)
    postprocess: Postprocess = Field(default_factory=Postprocess)
    health: HealthSpec | None = Field(default=None, description="health objectives checked on every device")


def load_card(path: Path) -> ModelCard:
    todo = todo_fields(read_toml(path, "model card"))
    if todo:  # a starter card (edgedeploy card init) not filled in: never build with a guess
        raise InputError(
            f"model card {path} still has a TODO in {', '.join(todo)}",
            hint='replace each "TODO: ..." with the value the model was trained with (the comment lists choices)',
        )
    card = read_toml_model(path, "model card", ModelCard)
    if card.labels_file:
        card = card.model_copy(update={"labels": read_labels(path.parent / card.labels_file), "labels_file": None})
    return card


def todo_fields(table: dict[str, Any], where: str = "") -> list[str]:
    """The fields whose value is a "TODO: ..." string (what `card init` could not read from the model)."""
    out = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += todo_fields(value, f"{where}{key}.")
        elif isinstance(value, str) and value.lstrip().upper().startswith("TODO"):
            out.append(f"{where}{key}")
    return out


def card_dirs() -> list[Path]:
    """Where cards are looked up by model hash: the user's config folder, then the built-in ones."""
    from importlib import resources

    return [config_dir() / "cards", Path(str(resources.files("edgedeploy.builtin_cards")))]


def find_card(model_sha256: str) -> tuple[Path, ModelCard] | None:
    """The card whose `source_sha256` is this model's, if any (so a known model needs no --card)."""
    for d in card_dirs():
        for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
            if read_toml(path, "model card").get("source_sha256") == model_sha256:  # the others are not read
                return path, load_card(path)
    return None


def card_for(model: Path, card: Path | None) -> tuple[ModelCard, Path | None]:
    """The card given, else the one that names this model file's sha256, else an empty card."""
    if card is not None:
        return load_card(card), card
    if model.is_file():
        found = find_card(hashlib.sha256(model.read_bytes()).hexdigest())
        if found:
            return found[1], found[0]
    return ModelCard(), None


CARD_HINT = "names and versions: letters, digits, '.', '_', '-' (a version may hold '+'); see edgedeploy build --help"


def card_with(
    base: ModelCard,
    name: str | None = None,
    version: str | None = None,
    labels: Path | None = None,
    preprocess: dict[str, Any] | None = None,
    postprocess: dict[str, Any] | None = None,
) -> ModelCard:
    """`base` with what the command line sets (None: keep the card's), validated as a whole."""
    pre = {k: v for k, v in (preprocess or {}).items() if v is not None}
    post = {k: v for k, v in (postprocess or {}).items() if v is not None}
    try:
        return ModelCard.model_validate(
            {
                **base.model_dump(),
                **({"name": name} if name else {}),
                **({"version": version} if version else {}),
                **({"labels": read_labels(labels)} if labels else {}),
                # only what the card and the options set counts as set (onnx_model.implied_color reads that)
                "preprocess": Preprocess.model_validate({**base.preprocess.model_dump(exclude_unset=True), **pre}),
                "postprocess": Postprocess.model_validate({**base.postprocess.model_dump(), **post}),
            }
        )
    except ValidationError as e:
        named = e.errors()[0]["loc"][:1] in (("name",), ("version",))
        raise InputError(validation_text(e), hint=CARD_HINT if named else "see edgedeploy build --help") from None


def read_labels(path: Path) -> list[str]:
    lines = read_text(path, "labels file").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputError(f"labels file {path} is empty")
    return lines


def default_name(path: Path) -> str:
    """A model name from a file name: its stem, with what a name may not hold replaced by "-"."""
    stem = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in path.stem)
    return stem.lstrip("._-")[:64] or "model"
