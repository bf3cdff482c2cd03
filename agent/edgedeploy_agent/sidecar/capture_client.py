"""A frame source captured under another Python (JetPack's, whose OpenCV has GStreamer), with the CvCapture interface.

The worker decodes each frame into shared memory (OpenCV writes into the array it is given); the agent copies
it out once, so the capture thread can read the next frame while the loop still holds this one. A worker that
dies or stops answering is a lost camera: `read` returns None, and the capture thread's reconnect calls `open`,
which starts a new worker (counted in `restarts`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import AgentError, SourceError
from ..sources.frames import SourceSpec
from .process import Sidecar

READ_TIMEOUT_S = 10.0  # a live pipeline that delivers nothing for this long is stuck: the worker is replaced


class SidecarCapture:
    def __init__(self, spec: SourceSpec, python: str, timeout_s: float = READ_TIMEOUT_S) -> None:
        self.spec, self.python, self.timeout_s = spec, python, timeout_s
        self._sidecar: Sidecar | None = None
        self.restarts = 0
        self.last_error: str | None = None

    def facts(self) -> dict[str, Any]:
        """The worker's Python, OpenCV and GStreamer (starting the worker if need be)."""
        return self._worker().request("info")

    def _worker(self) -> Sidecar:
        if self._sidecar is not None and not self._sidecar.alive():
            self._stop()
            self.restarts += 1
        if self._sidecar is None:
            self._sidecar = Sidecar(self.python, "capture", self.timeout_s)
        return self._sidecar

    def open(self) -> bool:
        try:
            reply = self._worker().request(
                "open",
                target=self.spec.target,
                backend=self.spec.backend,
                props={str(k): v for k, v in self.spec.props.items()},
            )
        except AgentError as e:
            self.last_error = e.message
            self._stop()
            return False
        return bool(reply.get("opened"))

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self._sidecar is None:
            return None
        try:
            reply = self._sidecar.request("read")
        except AgentError as e:  # died or hung: a lost camera; the reconnect starts a new worker
            self.last_error = e.message
            self._stop()
            return None
        spec = reply.get("frame")
        self.read_ms = float(reply.get("read_ms") or 0.0)
        if spec is None:
            return None
        frame: np.ndarray = self._sidecar.shm.array(spec)
        if out is not None and out.shape == frame.shape and out.dtype == frame.dtype:
            np.copyto(out, frame)  # the one copy out of shared memory goes into the consumer's buffer
            return out
        copied: np.ndarray = frame.copy()
        return copied

    def release(self) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._sidecar is not None:
            self._sidecar.close()
            self._sidecar = None


def open_sidecar_capture(
    spec: SourceSpec, python: str, timeout_s: float = READ_TIMEOUT_S
) -> tuple[SidecarCapture, dict[str, Any]]:
    """A SidecarCapture whose worker is up and whose OpenCV has GStreamer, with the worker's facts (its Python,
    OpenCV, GStreamer); SourceError otherwise."""
    capture = SidecarCapture(spec, python, timeout_s)
    try:
        facts = capture.facts()
    except AgentError as e:
        raise SourceError(f"{spec.uri!r}: cannot capture under {python}: {e.message}", hint=e.hint) from None
    if not facts.get("gstreamer"):
        capture.release()
        raise SourceError(
            f"{spec.uri!r} needs OpenCV with GStreamer; neither this agent's nor {python}'s "
            f"(OpenCV {facts.get('opencv')}) has it",
            hint="on a Jetson, system_python is JetPack's /usr/bin/python3.8 (NVIDIA's OpenCV has GStreamer)",
        )
    return capture, facts
