"""The signing serial floor: serials only grow, the floor is replaced whole, and a floor that is not a
number stops signing instead of reading as 0 (a serial below the devices' floor would be refused)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgedeploy.errors import InputError
from edgedeploy.signing import keys_dir, next_serial


def test_serials_grow_and_the_floor_is_written_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEDEPLOY_CONFIG_DIR", str(tmp_path))
    first = next_serial()
    assert next_serial() == first + 1
    assert next_serial(explicit=5) == 5  # an explicit serial is used as given, the floor stays
    assert (keys_dir() / "serial").read_text() == f"{first + 1}\n" and os.listdir(keys_dir()) == ["serial"]

    def power_cut(*args: object) -> None:
        raise OSError(5, "I/O error")

    monkeypatch.setattr(os, "fsync", power_cut)
    with pytest.raises(OSError):
        next_serial()
    monkeypatch.undo()
    monkeypatch.setenv("EDGEDEPLOY_CONFIG_DIR", str(tmp_path))
    assert (keys_dir() / "serial").read_text() == f"{first + 1}\n" and os.listdir(keys_dir()) == ["serial"]


@pytest.mark.parametrize("floor", [b"", b"\x00\x00\x00"], ids=["empty", "garbage"])
def test_a_floor_that_is_not_a_number_stops_signing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, floor: bytes
) -> None:
    monkeypatch.setenv("EDGEDEPLOY_CONFIG_DIR", str(tmp_path))
    keys_dir().mkdir(parents=True)
    (keys_dir() / "serial").write_bytes(floor)
    with pytest.raises(InputError, match="does not hold a serial number"):
        next_serial()
