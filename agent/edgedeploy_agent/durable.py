"""Durable writes, done one way everywhere: the new content goes to a temp file in the same folder, the
file is fsync'd, renamed over the old one, and the folder is fsync'd (a rename is only durable once its
folder is). A reader, a crash or a power cut sees the old content or the new, never an empty file.

Standard library only: the host imports it too, and so does `tune_offline` on a machine with only TVM.
"""

import json
import os
from pathlib import Path
from typing import Any, Union


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: Union[bytes, str], mode: int = 0o644) -> None:
    """Replace `path` with `data` (str is written as UTF-8); `mode` applies from the first byte."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
