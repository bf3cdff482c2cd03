"""Small real video clips for the capture and health tests."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np


def write_clip(path: Path, n: int, value: int) -> Path:
    """An MJPG clip of n frames; frame i has brightness value + i (readable back after JPEG)."""
    w = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25.0, (64, 48))
    for i in range(n):
        w.write(np.full((48, 64, 3), value + i, dtype=np.uint8))
    w.release()
    return path
