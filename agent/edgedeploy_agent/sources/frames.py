"""Frame sources addressed by URI. This release: `file:PATH` (a video file through cv2.VideoCapture).

`file:PATH` plays the file once; `file:PATH?loop=1` loops it forever.
"""

import time
from pathlib import Path
from typing import Optional, Protocol
from urllib.parse import parse_qs

import cv2
import numpy as np

from ..errors import SourceError

SUPPORTED_SCHEMES = ("file",)


class FrameSource(Protocol):
    uri: str

    def read(self) -> Optional[np.ndarray]:
        """The next BGR frame, or None when the source has ended."""
        ...

    def close(self) -> None: ...


class VideoFileSource:
    """A video file played once or in a loop."""

    def __init__(self, uri: str, path: Path, loop: bool = False) -> None:
        self.uri, self.path, self.loop = uri, path, loop
        if not path.is_file():
            raise SourceError(f"video file {path} does not exist")
        self._cap = self._open()

    def _open(self) -> "cv2.VideoCapture":
        cap = cv2.VideoCapture(str(self.path))
        if not cap.isOpened():
            raise SourceError(f"OpenCV cannot open video {self.path} (unsupported codec or corrupt file)")
        return cap

    def read(self) -> Optional[np.ndarray]:
        ok, frame = self._cap.read()
        if not ok and self.loop:
            self._cap.release()
            self._cap = self._open()
            ok, frame = self._cap.read()
        return frame if ok else None

    def close(self) -> None:
        self._cap.release()


def open_source(uri: str) -> FrameSource:
    scheme, _, rest = uri.partition(":")
    if scheme == "file" and rest:
        path_part, _, query = rest.partition("?")
        loop = parse_qs(query).get("loop", ["0"])[0] in ("1", "true", "yes")
        return VideoFileSource(uri, Path(path_part.removeprefix("//")), loop=loop)
    raise SourceError(
        f"unsupported frame source {uri!r}",
        hint=f"supported here: {', '.join(s + ':' for s in SUPPORTED_SCHEMES)} (e.g. file:/data/clip.mp4)",
    )


def timed_read(source: FrameSource) -> tuple[Optional[np.ndarray], float]:
    """Read one frame and return it with the wait in milliseconds."""
    t = time.perf_counter()
    frame = source.read()
    return frame, (time.perf_counter() - t) * 1000.0
