"""Durable writes: a rename is only durable once its folder is fsync'd."""

import os
from pathlib import Path


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
