"""The one durable write: old or new content, never half, never a temp file left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgedeploy_agent import durable
from edgedeploy_agent.durable import atomic_file, atomic_folder, move_durably, write_atomic, write_json_atomic


class PowerCut(Exception):
    pass


def _tree(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


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


def test_a_stream_that_breaks_off_midway_leaves_the_old_file_whole(tmp_path: Path) -> None:
    bundle = tmp_path / "b.edb"
    with atomic_file(bundle) as f:
        for _ in range(4):
            f.write(b"o" * 65536)
    with pytest.raises(PowerCut), atomic_file(bundle) as f:
        f.write(b"n" * 65536)
        f.flush()  # half of the new content is on disk, in the temp file
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        raise PowerCut
    assert bundle.read_bytes() == b"o" * 4 * 65536
    assert os.listdir(tmp_path) == ["b.edb"]


def test_the_streaming_form_writes_text_and_syncs_file_then_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd)))
    with atomic_file(tmp_path / "labels.txt", encoding="utf-8") as f:
        f.write("chat\n")
        f.write("ümlaut\n")
    assert (tmp_path / "labels.txt").read_text(encoding="utf-8") == "chat\nümlaut\n"
    assert synced[0].endswith(".tmp") and synced[-1] == str(tmp_path)  # the bytes first, the rename last
    synced.clear()
    write_atomic(tmp_path / "heartbeat", "1 2\n", sync=False)  # for state of a live process only
    assert synced == [] and (tmp_path / "heartbeat").read_text() == "1 2\n"


def test_two_writers_of_one_file_never_share_a_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "serial"
    with atomic_file(target) as a, atomic_file(target) as b:
        a.write(b"1\n")
        b.write(b"2\n")
    assert target.read_text() == "1\n"  # b is renamed first, a last: the last rename wins, whole
    assert os.listdir(tmp_path) == ["serial"]


def test_move_durably_renames_a_finished_file_over_the_target(tmp_path: Path) -> None:
    (tmp_path / "lib.tmp").write_bytes(b"new")
    (tmp_path / "lib").write_bytes(b"old")
    os.chmod(tmp_path / "lib.tmp", 0o444)  # a read-only file is synced too
    move_durably(tmp_path / "lib.tmp", tmp_path / "lib")
    assert os.listdir(tmp_path) == ["lib"] and (tmp_path / "lib").read_bytes() == b"new"


def test_a_folder_appears_whole_and_replaces_the_old_one(tmp_path: Path) -> None:
    entry = tmp_path / "engines" / "k"
    with atomic_folder(entry) as d:
        assert d.name == ".tmp-k" and not entry.exists()  # nothing at the target while it is built
        (d / "plan").write_text("v1")
        (d / "sub").mkdir()
        (d / "sub" / "x").write_text("x1")
    assert _tree(entry) == {"plan": "v1", "sub/x": "x1"}
    with atomic_folder(entry) as d:
        (d / "plan").write_text("v2")
    assert _tree(entry) == {"plan": "v2"}  # replaced, not merged
    assert os.listdir(entry.parent) == ["k"]


def test_a_failed_folder_build_leaves_the_old_folder_and_no_temp_folder(tmp_path: Path) -> None:
    entry = tmp_path / "k"
    with atomic_folder(entry) as d:
        (d / "plan").write_text("v1")
    with pytest.raises(PowerCut), atomic_folder(entry) as d:
        (d / "plan").write_text("v2")
        raise PowerCut
    assert _tree(entry) == {"plan": "v1"}
    assert os.listdir(tmp_path) == ["k"]


def test_a_replace_stopped_between_its_two_renames_gets_the_old_folder_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = tmp_path / "k"
    with atomic_folder(entry) as d:
        (d / "plan").write_text("v1")
    replace = os.replace

    def second_rename_fails(src: Path, dst: Path) -> None:
        if Path(src).name == ".tmp-k":
            raise PowerCut
        replace(src, dst)

    monkeypatch.setattr(durable.os, "replace", second_rename_fails)
    with pytest.raises(PowerCut), atomic_folder(entry) as d:
        (d / "plan").write_text("v2")
    assert _tree(entry) == {"plan": "v1"} and os.listdir(tmp_path) == ["k"]


def test_the_leftovers_of_a_crash_are_settled_by_the_next_folder_write(tmp_path: Path) -> None:
    """A power cut after the old folder went aside: the target is missing, `.old-k` and `.tmp-k` are there."""
    (tmp_path / ".old-k").mkdir()
    (tmp_path / ".old-k" / "plan").write_text("v1")
    (tmp_path / ".tmp-k").mkdir()
    (tmp_path / ".tmp-k" / "half").write_text("h")
    with atomic_folder(tmp_path / "k") as d:
        assert os.listdir(d) == [] and _tree(tmp_path / "k") == {"plan": "v1"}  # the old one is back first
        (d / "plan").write_text("v2")
    assert _tree(tmp_path / "k") == {"plan": "v2"} and os.listdir(tmp_path) == ["k"]
