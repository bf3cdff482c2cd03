"""`edgedeploy-agent install-bundle`: the refusals that protect the root (the deploy path itself is the push's,
tested end to end in tests/integration/test_field_offline.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.agent.bundles import make_bundle
from tests.helpers import agent, require_root


def test_missing_file_and_root_owned_by_someone_else(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert agent("--root", str(root), "init").code == 0
    r = agent("--root", str(root), "install-bundle", str(tmp_path / "usb" / "model.edb"))
    assert r.code == 9 and "does not exist" in r.err and "USB stick" in r.err
    require_root("the root-ownership refusal needs root to be produced")
    bundle = make_bundle(tmp_path / "b")
    os.chown(root, 65534, 65534)
    try:
        r = agent("--root", str(root), "install-bundle", str(bundle))
        assert r.code == 9 and "refusing to install as root" in r.err and "sudo -u edgedeploy" in r.err, r.err
        assert not any((root / "models" / "default" / "releases").iterdir()) and bundle.is_file()
    finally:
        shutil.chown(root, 0, 0)
