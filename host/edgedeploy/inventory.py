"""The fleet inventory: devices.toml -> Device. Default in the user config folder.

[devices.xavier-01]
host = "10.0.0.5"
user = "edgedeploy"
key_file = "~/.ssh/edgedeploy_ed25519"
profile = "xavier-agx"
tags = ["lab"]
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from edgedeploy_agent.names import DEFAULT_SLOT, DEVICE_NAME_PATTERN, check_extra_slots

from .errors import InputError, InventoryError, validation_text
from .paths import config_dir
from .userfiles import read_toml, write_text_atomic

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ModelSlot(BaseModel):
    """[devices.NAME.models.SLOT]: one more model on the device (`push --model SLOT`) and the source it serves."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(default=None, description="frame source URI of this model on the device")

    @field_validator("source")
    @classmethod
    def _no_control_characters(cls, value: str | None) -> str | None:
        if value is not None and _CONTROL.search(value):
            raise ValueError(f"{value!r} holds a control character (newline, tab, ...)")
        return value


class Device(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=DEVICE_NAME_PATTERN)  # the agent's rule too (edgedeploy_agent/names.py)
    host: str
    port: int = Field(default=22, ge=1, le=65535)
    user: str = "edgedeploy"
    key_file: str | None = None
    profile: str
    tags: list[str] = Field(default_factory=list)
    root: str = Field(default="/var/lib/edgedeploy", description="the agent's state folder on the device")
    service: Literal["systemd", "process"] = "systemd"
    transport: Literal["ssh", "local"] = "ssh"
    agent_command: str = Field(default="edgedeploy-agent", description="path of edgedeploy-agent on the device")
    source: str | None = Field(default=None, description="frame source URI on the device")
    sources: list[str] = Field(
        default_factory=list, description="several frame sources served by one agent (instead of source)"
    )
    max_batch_wait_ms: float | None = Field(
        default=None, ge=0, description="several sources: how long a batch waits for the other sources' frames"
    )
    keep_releases: int = Field(default=3, ge=2, description="releases the device keeps (current + previous)")
    models: dict[str, ModelSlot] = Field(
        default_factory=dict, description="models besides `default` (whose source is `source`), by slot name"
    )

    @field_validator("models")
    @classmethod
    def _slot_names(cls, value: dict[str, ModelSlot]) -> dict[str, ModelSlot]:
        check_extra_slots(value)
        return value

    @field_validator("host", "user", "key_file", "profile", "tags", "root", "agent_command", "source", "sources")
    @classmethod
    def _no_control_characters(cls, value: str | list[str] | None) -> str | list[str] | None:
        # these end up in unit files, sudoers rules and command lines, where a newline starts a new entry
        for text in [value] if isinstance(value, str) else value or []:
            if _CONTROL.search(text):
                raise ValueError(f"{text!r} holds a control character (newline, tab, ...)")
        return value

    @model_validator(mode="after")
    def _one_way_to_name_sources(self) -> Device:
        if self.source is not None and self.sources:
            raise ValueError("give source (one camera) or sources (several), not both")
        return self

    def source_args(self, model: str = DEFAULT_SLOT) -> list[str]:
        """The agent's options for the sources of one of this device's models: `--source` once per source (none
        when the inventory names none: the device keeps its own) and the batch wait when set. A model besides
        `default` has its one source from `[devices.NAME.models.SLOT]`."""
        if model != DEFAULT_SLOT:
            slot = self.models.get(model)
            return ["--source", slot.source] if slot and slot.source else []
        uris = [self.source] if self.source is not None else self.sources
        args = [a for uri in uris for a in ("--source", uri)]
        if self.max_batch_wait_ms is not None:
            args += ["--max-batch-wait-ms", f"{self.max_batch_wait_ms:g}"]
        return args

    @property
    def address(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def inventory_path(override: Path | str | None = None) -> Path:
    if override:
        return Path(override).expanduser()
    env = os.environ.get("EDGEDEPLOY_INVENTORY")
    return Path(env).expanduser() if env else config_dir() / "devices.toml"


class Inventory:
    def __init__(self, path: Path, devices: dict[str, Device]) -> None:
        self.path, self.devices = path, devices

    @property
    def known_hosts(self) -> Path:
        """The fleet's own pinned host keys, kept next to the inventory."""
        return self.path.with_name("known_hosts")

    @classmethod
    def load(cls, override: Path | str | None = None) -> Inventory:
        path = inventory_path(override)
        if not path.exists():
            return cls(path, {})
        data = read_toml(path, "inventory", InventoryError)
        devices: dict[str, Device] = {}
        table = data.get("devices", {})
        if not isinstance(table, dict) or set(data) - {"devices"}:
            raise InventoryError(f"inventory {path}: expected only [devices.NAME] tables")
        for name, entry in table.items():
            if not isinstance(entry, dict):
                raise InventoryError(f"inventory {path}: devices.{name} must be a table")
            try:
                devices[name] = Device.model_validate({**entry, "name": name})
            except ValidationError as e:
                raise InventoryError(f"inventory {path}: devices.{name}.{validation_text(e)}") from None
        return cls(path, devices)

    def get(self, name: str) -> Device:
        if name not in self.devices:
            known = ", ".join(sorted(self.devices)) or "none"
            raise InventoryError(
                f"unknown device {name!r} in {self.path}",
                hint=f"known devices: {known}; add one with `edgedeploy devices add`",
            )
        return self.devices[name]

    def select(self, names: list[str] | None = None, tag: str | None = None) -> list[Device]:
        if names:
            return [self.get(n) for n in names]
        return [d for d in self.devices.values() if tag is None or tag in d.tags]

    def add(self, device: Device, replace: bool = False) -> None:
        if device.name in self.devices and not replace:
            raise InventoryError(f"device {device.name!r} already exists", hint="use --replace to overwrite it")
        self.devices[device.name] = device
        self.save()

    def remove(self, name: str) -> Device:
        dev = self.get(name)
        del self.devices[name]
        self.save()
        return dev

    def save(self) -> None:
        data = {
            "devices": {
                # (no `sources = []` for a device with one source: the file reads as it did before several)
                n: d.model_dump(exclude={"name"} | (set() if d.sources else {"sources"}), exclude_none=True)
                for n, d in sorted(self.devices.items())
            }
        }
        hint = "choose a writable place with --inventory (or EDGEDEPLOY_INVENTORY, EDGEDEPLOY_CONFIG_DIR)"
        write_text_atomic(self.path, tomli_w.dumps(data), "inventory", hint)


def select_devices(inv: Inventory, names: list[str] | None, tag: str | None) -> list[str]:
    """The names `--devices a,b,c` or `--group TAG` choose (one of them is required; a tag must match)."""
    if not names and not tag:
        raise InputError("say which devices: --group TAG or --devices a,b,c")
    chosen = [d.name for d in inv.select(names, tag)]
    if not chosen:
        raise InputError(f"no device in {inv.path} has tag {tag!r}")
    return chosen
