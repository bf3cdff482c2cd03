"""Durable writes, done one way everywhere: a reader, a crash or a power cut sees the old content or the
new, never an empty or half-written file or folder.

- `atomic_file(path)`: a file object on a temp file beside `path` (`.NAME.RANDOM.tmp`); when the block ends
  without an error the file is flushed and fsync'd, renamed over `path`, and the folder is fsync'd (a
  rename is only durable once its folder is). An error (or Ctrl-C) leaves the old content and no temp file.
  The streaming form, for bundles, engines, build-store copies; `write_atomic` is the one-shot form.
- `move_durably(src, dst)`: the last step alone, for a complete file something else wrote (a compiler, a
  download, an upload): fsync it, rename it over `dst`, fsync the folder.
- `atomic_folder(path)`: an empty temp folder beside `path` (`.tmp-NAME`) to fill; when the block ends
  without an error everything in it is fsync'd and it is renamed into place, replacing the folder there.
  One writer at a time per folder (the callers hold a lock); see `atomic_folder` for the crash windows.

Standard library only: the host imports it too, and so does `tune_offline` on a machine with only TVM.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO, TextIO, overload


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Flush a complete file's bytes to disk (read-only files too: fsync needs no write access)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_temp(path: Path, mode: int) -> tuple[Path, int]:
    """A new file beside `path`, created with `mode` (less the umask) from the first byte."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:  # another writer's temp file: draw again
            continue


@overload
def atomic_file(
    path: Path, mode: int = 0o644, *, encoding: None = None, sync: bool = True
) -> AbstractContextManager[BinaryIO]: ...


@overload
def atomic_file(
    path: Path, mode: int = 0o644, *, encoding: str, sync: bool = True
) -> AbstractContextManager[TextIO]: ...


def atomic_file(
    path: Path, mode: int = 0o644, *, encoding: str | None = None, sync: bool = True
) -> AbstractContextManager[IO[Any]]:
    """Write `path` through the yielded file (binary; text with `encoding`): all of it appears, or nothing.

    `mode` applies from the first byte (a key is never readable by others, not even half-written).
    `sync=False` skips both fsyncs: still never torn for a reader, but a power cut may lose the update
    (for files that describe a live process, like the heartbeat)."""
    return _atomic_file(path, mode, encoding, sync)


@contextmanager
def _atomic_file(path: Path, mode: int, encoding: str | None, sync: bool) -> Iterator[IO[Any]]:
    tmp, fd = _create_temp(path, mode)
    try:
        with os.fdopen(fd, "w" if encoding else "wb", encoding=encoding) as f:
            yield f
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        fsync_dir(path.parent)


def write_atomic(path: Path, data: bytes | str, mode: int = 0o644, sync: bool = True) -> None:
    """Replace `path` with `data` (str is written as UTF-8); see `atomic_file`."""
    with atomic_file(path, mode, sync=sync) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def move_durably(src: Path, dst: Path) -> None:
    """Rename `src`, a complete file written by something else, over `dst` (same file system), durably."""
    fsync_file(src)
    os.replace(src, dst)
    fsync_dir(dst.parent)


def _fsync_tree(d: Path) -> None:
    """fsync every file and folder under `d`, folders after what they hold."""
    for top, dirs, files in os.walk(d, topdown=False):
        for name in files:
            fsync_file(Path(top) / name)
        for name in dirs:
            fsync_dir(Path(top) / name)
    fsync_dir(d)


def _settle(path: Path, old: Path) -> None:
    """Finish a replace that stopped between its two renames: the old folder goes back if no new one came."""
    if not old.exists():
        return
    if path.exists():
        shutil.rmtree(old)
    else:
        os.replace(old, path)
        fsync_dir(path.parent)


@contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield an empty folder (`.tmp-NAME` beside `path`) to fill; when the block ends without an error its
    tree is fsync'd and it becomes `path`, replacing any folder there. An error removes it, `path` unchanged.

    A folder cannot be renamed over a non-empty one: the old one is renamed aside (`.old-NAME`) first,
    then the new one into place. A crash between those two renames leaves `path` missing until the next
    `atomic_folder(path)`, which moves the old folder back first; a crash before them leaves `.tmp-NAME`,
    removed by the next one too."""
    tmp, old = path.with_name(f".tmp-{path.name}"), path.with_name(f".old-{path.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    _settle(path, old)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        _settle(path, old)
        raise
    fsync_dir(path.parent)
    if old.exists():
        shutil.rmtree(old)
