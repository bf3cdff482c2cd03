"""Pushing to an enrolled loopback device and reading back what it runs (tests/integration/conftest.py's devices)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers import Cli
from tests.integration.conftest import Enrolled


def current(dev: Enrolled) -> str | None:
    """The release the device's `current` link names, or None."""
    link = dev.root / "models" / "default" / "current"
    return os.readlink(link).split("/")[-1] if link.is_symlink() else None


def push_ok(cli: Cli, dev: Enrolled, bundle: Path) -> None:
    r = cli("push", dev.name, str(bundle), "--json", *dev.args())
    assert r.code == 0, r.err
    assert json.loads(r.out)["outcome"] == "committed"
