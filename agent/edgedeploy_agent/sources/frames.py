"""Frame sources addressed by URI, opened through OpenCV.

    file:PATH[?loop=1][&live=1][&fps=N]  a video file, once or looped; live=1 treats it like a camera; fps=N plays it
                                         at N frames a second (a recorded clip replayed at a camera's rate)
    v4l2:/dev/video0[?width=&height=&fps=]   a USB/V4L2 camera (OpenCV's V4L2 backend, 1-frame buffer)
    csi:0[?width=&height=&fps=]          a Jetson CSI camera (nvarguscamerasrc GStreamer pipeline)
    rtsp://...                           an RTSP stream (OpenCV's FFmpeg backend)
    gst:<pipeline>                       any GStreamer pipeline ending in (or given) an appsink

Live sources (cameras, streams, live=1) lose and regain frames; see capture.py for the thread that
keeps only the latest frame and reconnects with backoff.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Protocol
from urllib.parse import parse_qs

import cv2
import numpy as np

from ..errors import SourceError
from ..sidecar.python_facts import has_gstreamer

SUPPORTED_SCHEMES = ("file", "v4l2", "csi", "rtsp", "gst")
APPSINK = "appsink drop=true max-buffers=1 sync=false"


def opencv_has_gstreamer() -> bool:
    return has_gstreamer(cv2.getBuildInformation())


@dataclass(frozen=True)
class SourceSpec:
    """What to hand to cv2.VideoCapture for one URI (pure data; parse_source does no I/O)."""

    uri: str
    scheme: str
    target: str
    backend: int
    live: bool
    loop: bool = False
    props: dict[int, float] = field(default_factory=dict)
    fps: Optional[int] = None  # a file: deliver no more than this many frames a second (None: as fast as taken)

    @property
    def needs_gstreamer(self) -> bool:
        return self.backend == cv2.CAP_GSTREAMER


def _query(text: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}


def _flag(q: dict[str, str], name: str) -> bool:
    return q.get(name, "0").lower() in ("1", "true", "yes")


def _int(q: dict[str, str], name: str, default: int, uri: str) -> int:
    try:
        value = int(q.get(name, default))
    except ValueError:
        raise SourceError(f"{uri!r}: {name} must be an integer, got {q[name]!r}") from None
    if value <= 0:
        raise SourceError(f"{uri!r}: {name} must be positive")
    return value


def csi_pipeline(sensor_id: int, width: int, height: int, fps: int) -> str:
    """The Argus pipeline for a Jetson CSI camera: NVMM capture, hardware convert, BGR appsink."""
    return (
        f"nvarguscamerasrc sensor-id={sensor_id} ! "
        f"video/x-raw(memory:NVMM),width={width},height={height},format=NV12,framerate={fps}/1 ! "
        "nvvidconv flip-method=0 ! video/x-raw,format=BGRx ! videoconvert ! video/x-raw,format=BGR ! " + APPSINK
    )


def parse_source(uri: str) -> SourceSpec:
    """Turn a source URI into what OpenCV needs; raises SourceError naming the valid forms."""
    scheme, sep, rest = uri.partition(":")
    if not sep or not rest:
        scheme = ""
    if scheme == "file":
        path, _, query = rest.partition("?")
        q = _query(query)
        target = path.removeprefix("//")
        fps = _int(q, "fps", 0, uri) if "fps" in q else None
        return SourceSpec(uri, "file", target, cv2.CAP_ANY, live=_flag(q, "live"), loop=_flag(q, "loop"), fps=fps)
    if scheme == "v4l2":
        path, _, query = rest.partition("?")
        q = _query(query)
        props: dict[int, float] = {cv2.CAP_PROP_BUFFERSIZE: 1}
        for name, prop in (("width", cv2.CAP_PROP_FRAME_WIDTH), ("height", cv2.CAP_PROP_FRAME_HEIGHT)):
            if name in q:
                props[prop] = _int(q, name, 0, uri)
        if "fps" in q:
            props[cv2.CAP_PROP_FPS] = _int(q, "fps", 0, uri)
        return SourceSpec(uri, "v4l2", path or "/dev/video0", cv2.CAP_V4L2, live=True, props=props)
    if scheme == "csi":
        sensor, _, query = rest.partition("?")
        q = _query(query)
        if not sensor.isdigit():
            raise SourceError(f"{uri!r}: csi: needs a sensor id, e.g. csi:0?width=1280&height=720&fps=30")
        pipeline = csi_pipeline(
            int(sensor), _int(q, "width", 1280, uri), _int(q, "height", 720, uri), _int(q, "fps", 30, uri)
        )
        return SourceSpec(uri, "csi", pipeline, cv2.CAP_GSTREAMER, live=True)
    if scheme in ("rtsp", "rtsps"):
        return SourceSpec(uri, "rtsp", uri, cv2.CAP_FFMPEG, live=True)
    if scheme == "gst":
        pipeline = rest.strip()
        if "appsink" not in pipeline:
            pipeline += " ! videoconvert ! video/x-raw,format=BGR ! " + APPSINK
        return SourceSpec(uri, "gst", pipeline, cv2.CAP_GSTREAMER, live=True)
    raise SourceError(
        f"unsupported frame source {uri!r}",
        hint="use file:PATH[?loop=1][&fps=N], v4l2:/dev/video0[?width=&height=&fps=], csi:0, rtsp://HOST/PATH or "
        "gst:PIPELINE",
    )


def check_openable(spec: SourceSpec, gstreamer: Optional[bool] = None) -> None:
    """Refuse what cannot work at all on this device (as opposed to a camera that is unplugged now)."""
    if spec.needs_gstreamer and not (opencv_has_gstreamer() if gstreamer is None else gstreamer):
        raise SourceError(
            f"{spec.uri!r} needs OpenCV with GStreamer, but this OpenCV ({cv2.__version__}) was built without it",
            hint="the pip opencv wheels have no GStreamer: set system_python (edgedeploy-agent init --system-python "
            "/usr/bin/python3.8 on JetPack) to capture under the system's OpenCV, or use a v4l2: source",
        )
    if spec.scheme == "file" and not spec.live and not Path(spec.target).is_file():
        raise SourceError(f"video file {spec.target} does not exist")


class Capture(Protocol):
    """What the capture thread drives: CvCapture here, or SidecarCapture under another Python's OpenCV."""

    def open(self) -> bool: ...

    def read(self, out: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        """The next BGR frame, written into `out` where it can (same shape and dtype), else a new array."""

    def release(self) -> None: ...


class CvCapture:
    """One cv2.VideoCapture opened from a spec; open() may be called again after a loss."""

    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self._cap: Optional[cv2.VideoCapture] = None

    def open(self) -> bool:
        self.release()
        cap = cv2.VideoCapture(self.spec.target, self.spec.backend)
        if not cap.isOpened():
            cap.release()
            return False
        for prop, value in self.spec.props.items():
            cap.set(prop, value)  # a backend that ignores a property still delivers frames
        self._cap = cap
        return True

    def read(self, out: Optional[np.ndarray] = None) -> Optional[np.ndarray]:
        if self._cap is None:
            return None
        # OpenCV decodes into `out` when its shape and dtype are the frame's, else allocates (a new resolution)
        ok, frame = self._cap.read() if out is None else self._cap.read(image=out)
        return frame if ok else None

    def release(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None
