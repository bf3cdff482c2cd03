"""The one durable write: old or new content, never half, never a temp file left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgedeploy_agent.durable import write_atomic, write_json_atomic


def test_write_replaces_the_content_with_the_mode_from_the_first_byte(tmp_path: Path) -> None:
    key = tmp_path / "k.key"
    write_atomic(key, b"old")
    write_atomic(key, "new secret", mode=0o600)
    assert key.read_text() == "new secret"
    assert key.stat().st_mode & 0o777 == 0o600
    assert os.listdir(tmp_path) == ["k.key"]


def test_a_failed_write_leaves_the_old_content_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state.json"
    write_json_atomic(state, {"current": "a"})

    def power_cut(*args: object) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", power_cut)
    with pytest.raises(OSError):
        write_json_atomic(state, {"current": "b"})
    assert state.read_text() == '{\n "current": "a"\n}'
    assert os.listdir(tmp_path) == ["state.json"]
