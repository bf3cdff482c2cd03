"""Capture in its own thread. Live sources keep only the latest frame and reconnect with backoff.

A video file played normally is not a camera: every frame is handed over (the reader waits for the
consumer), so a recorded clip gives the same predictions every run; `fps=N` plays it no faster than N frames a
second (with live=1 as well: a camera of that rate, whose frames the consumer may miss). A live source never queues: a
frame the consumer did not take in time is replaced by the next one and counted as dropped.

A consumer may lend the frame buffers (`allocate_frame`: a GPU runtime's page-locked ones, `frame_batch`): the
decoder then writes into them (cv2.VideoCapture.read(image=...)), so no host copy stands between decoding and the
upload. Three per resolution: one being decoded into, the newest frame waiting, and the one the consumer took last
(it holds that one until it reads the next). With `send_frame` (a GPU runtime's `send_frames`), each frame decoded
into a lent buffer is sent on from the capture thread at once, before it is handed over: its upload runs while the
consumer is still being woken for it.
"""

import ctypes
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..errors import SourceError
from ..sidecar.python_facts import capture_facts
from .frames import Capture, CvCapture, SourceSpec, check_openable, opencv_has_gstreamer, parse_source

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
STALE_AFTER_S = 5.0
LENT_BUFFERS = 3
SPIN_NAP_S = 1e-6  # a spinning read's nap between looks (read): a real sleep, which the timer slack stretches
PR_SET_TIMERSLACK = 29  # linux/prctl.h
FINE_SLACK_NS = 1000


def fine_naps() -> bool:
    """Set the calling thread's timer slack to 1 us (Linux: prctl PR_SET_TIMERSLACK; the default, 50 us, lets the
    kernel end a short sleep up to that much late): a spinning read's naps then last about 15 us, not 70 (the
    development machine), so a frame handed over mid-nap waits that much less (70 us naps cost a one-source agent
    7-13 % of its fps at 2400-4200 fps on an H100; the spin still costs fps where the decoder needs the polling
    core: docs/agent-service.md). For the thread that reads with a spin (the agent's loop). False where the call is
    not there."""
    try:
        return int(ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, FINE_SLACK_NS, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


@dataclass
class Frame:
    image: np.ndarray
    index: int
    captured: float  # time.monotonic() when the frame was read

    @property
    def age_ms(self) -> float:
        return (time.monotonic() - self.captured) * 1000.0


@dataclass
class SourceState:
    camera_up: bool
    reconnects: int
    dropped_frames: int
    frames_captured: int
    last_error: Optional[str]


class CapturedSource:
    """A FrameSource whose frames are read by a background thread."""

    def __init__(
        self,
        spec: SourceSpec,
        backoff_start_s: float = BACKOFF_START_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        stale_after_s: float = STALE_AFTER_S,
        capture_factory: Callable[[SourceSpec], Capture] = CvCapture,
        where: Optional[dict[str, Any]] = None,
        allocate_frame: Optional[Callable[[int, int], np.ndarray]] = None,
        send_frame: Optional[Callable[[np.ndarray], bool]] = None,
    ) -> None:
        self.spec, self.uri = spec, spec.uri
        # the Python and OpenCV that capture: this process's, or a sidecar's (open_source says which)
        self.where: dict[str, Any] = where if where is not None else {**capture_facts(), "sidecar": False}
        self._backoff = (backoff_start_s, backoff_max_s)
        self._stale_after_s = stale_after_s
        self._capture = capture_factory(spec)
        self._cond = threading.Condition()
        self._latest: Optional[Frame] = None
        self._taken = -1
        self._held: Optional[np.ndarray] = None  # the image of the frame the consumer took last
        self._allocate = allocate_frame  # (height, width) -> a uint8 (height, width, 3) buffer, or None
        self._buffers: list[np.ndarray] = []  # the lent buffers of the current resolution
        self.copied = 0  # frames copied into a lent buffer because the decoder wrote elsewhere
        self._send = send_frame  # a lent buffer just filled -> True when its upload was queued
        self.sent = 0  # frames whose upload send_frame queued
        self._due = 0.0  # when the next frame of a paced file (spec.fps) may be handed over: time.monotonic()
        self._ended = False
        self._closing = False
        self._up = False
        self.reconnects = 0
        self.captured = 0
        self.consumed = 0
        self.last_error: Optional[str] = None
        # called by the capture thread on a new frame, a state change and the end: a multi-source agent waits on
        # all its sources at once (batcher.py)
        self.on_change: Callable[[], None] = _nothing
        opened = False
        if not spec.live:
            # a file that OpenCV cannot decode is a bad source, not a camera that may come back
            if not self._capture.open():
                raise SourceError(f"OpenCV cannot open video {spec.target} (unsupported codec or corrupt file)")
            opened = True
        self._thread = threading.Thread(target=self._run, args=(opened,), name=f"capture {spec.scheme}", daemon=True)
        self._thread.start()

    # --- the consumer side -------------------------------------------------------------------
    def read(self, timeout: Optional[float] = None, spin_s: float = 0.0) -> Optional[Frame]:
        """The newest frame not yet taken; None on timeout or when the source has ended. `spin_s`: poll for the
        frame that long first, napping SPIN_NAP_S between looks (the capture thread may take the GIL then to hand
        the frame over; the thread's timer slack stretches each nap: 50 us by default, 1 us after fine_naps), and
        only then sleep until the capture thread wakes this one: a frame that comes within the spin starts on a
        core that never went idle for long (the agent's loop: frame_spin_ms)."""
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        spin_until = now + spin_s if deadline is None else min(now + spin_s, deadline)
        with self._cond:
            while True:
                if self._latest is not None and self._latest.index > self._taken:
                    frame = self._latest
                    self._taken = frame.index
                    self._held = frame.image  # (the one taken before is free again)
                    self.consumed += 1
                    self._cond.notify_all()
                    return frame
                if self._ended or self._closing:
                    return None
                now = time.monotonic()
                if now < spin_until:
                    self._cond.release()  # (the capture thread needs the lock to hand a frame over)
                    time.sleep(SPIN_NAP_S)
                    self._cond.acquire()
                    continue
                remaining = None if deadline is None else deadline - now
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    @property
    def ended(self) -> bool:
        with self._cond:
            return self._ended and (self._latest is None or self._latest.index <= self._taken)

    def state(self) -> SourceState:
        with self._cond:
            fresh = self._latest is not None and (time.monotonic() - self._latest.captured) < self._stale_after_s
            # a live source that blocks without delivering is lost even if OpenCV never said so
            up = self._up and (fresh or not self.spec.live or self.captured == 0)
            return SourceState(
                camera_up=up,
                reconnects=self.reconnects,
                dropped_frames=max(self.captured - self.consumed, 0) if self.spec.live else 0,
                frames_captured=self.captured,
                last_error=self.last_error,
            )

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        self._capture.release()

    # --- the capture thread ------------------------------------------------------------------
    def _set_up(self, up: bool, error: Optional[str] = None) -> None:
        with self._cond:
            self._up = up
            if error:
                self.last_error = error
            self._cond.notify_all()
        self.on_change()

    def _sleep(self, seconds: float) -> bool:
        """Wait, waking early on close; False when closing."""
        with self._cond:
            self._cond.wait_for(lambda: self._closing, timeout=seconds)
            return not self._closing

    def _run(self, opened: bool) -> None:
        delay, lost = self._backoff[0], False
        while not self._closing:
            if not opened:
                if not self._capture.open():
                    self._set_up(False, f"cannot open {self.spec.uri}")
                    if not self.spec.live or not self._sleep(delay):
                        break
                    delay, lost = min(delay * 2, self._backoff[1]), True
                    continue
                if lost:
                    self.reconnects += 1
            opened, delay = False, self._backoff[0]
            self._set_up(True)
            self._pump()
            if self._closing or not (self.spec.live or self.spec.loop):
                break
            if self.spec.live:
                lost = True
                self._set_up(False, f"{self.spec.uri} stopped delivering frames")
                if not self._sleep(delay):
                    break
        self._capture.release()
        with self._cond:
            self._ended = True
            self._up = self._up and not self.spec.live  # a file that played to its end was never "lost"
            self._cond.notify_all()
        self.on_change()

    def _free_buffer(self) -> Optional[np.ndarray]:
        """A lent buffer neither the newest frame nor the consumer's holds; None without lent buffers (or before the
        first frame told their size)."""
        with self._cond:
            busy = {id(self._held), id(self._latest.image) if self._latest is not None else None}
            return next((b for b in self._buffers if id(b) not in busy), None)

    def _into_lent(self, image: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
        """The decoded frame, in a lent buffer where it fits: a decoder that wrote elsewhere (OpenCV reallocates for
        another size) is copied; a new resolution gets new buffers from the next frame on."""
        if self._allocate is None or image is out:
            return image
        if out is not None and out.shape == image.shape:
            np.copyto(out, image)
            self.copied += 1
            return out
        if image.ndim == 3 and image.shape[2] == 3 and image.dtype == np.uint8:
            try:
                self._buffers = [self._allocate(*image.shape[:2]) for _ in range(LENT_BUFFERS)]
            except Exception as e:  # (page-locked memory may run out): decode into OpenCV's own arrays, as before
                self._allocate, self._buffers = None, []
                self.last_error = f"no frame buffers from the runtime: {type(e).__name__}: {e}"
        return image

    def _send_on(self, image: np.ndarray) -> None:
        """Hand a lent buffer just filled to `send_frame`; one that raises is not called again (the consumer then
        uploads each frame itself, as without it)."""
        try:
            self.sent += bool(self._send(image))  # type: ignore[misc]
        except Exception as e:  # a runtime's driver call fails with any error type
            self._send = None
            self.last_error = f"sending frames on failed: {type(e).__name__}: {e}"

    def _pace(self) -> bool:
        """A file played at `fps=N`: wait until this frame is due (a frame late by more than a period moves the clock
        on rather than letting the next ones come in a burst); False when closing."""
        if not self.spec.fps:
            return True
        wait = self._due - time.monotonic()
        if wait > 0 and not self._sleep(wait):
            return False
        self._due = max(self._due, time.monotonic()) + 1.0 / self.spec.fps
        return True

    def _pump(self) -> None:
        """Read frames until the capture fails or the source closes."""
        while not self._closing:
            out = self._free_buffer()
            image = self._capture.read(out)
            if image is None or not self._pace():
                return
            image = self._into_lent(image, out)
            if self._send is not None and image is out:  # a lent buffer, just filled
                self._send_on(image)
            with self._cond:
                if not self.spec.live:
                    # a file: wait until the consumer took the previous frame (no frame is skipped)
                    self._cond.wait_for(
                        lambda: self._closing or self._latest is None or self._latest.index <= self._taken
                    )
                self._latest = Frame(image, self.captured, time.monotonic())
                self.captured += 1
                self._cond.notify_all()
            self.on_change()


def _nothing() -> None:
    pass


def open_source(
    uri: str,
    system_python: Optional[str] = None,
    sidecar_timeout_s: float = 10.0,
    allocate_frame: Optional[Callable[[int, int], np.ndarray]] = None,
    send_frame: Optional[Callable[[np.ndarray], bool]] = None,
    **kwargs: float,
) -> CapturedSource:
    """Parse, check and start capturing a source URI (into buffers from `allocate_frame`, each sent on to
    `send_frame` once filled: CapturedSource says how).

    A gst: or csi: source that this OpenCV cannot open (no GStreamer) is captured by a sidecar worker under
    `system_python` (JetPack's Python and OpenCV) when one is configured."""
    spec = parse_source(uri)
    if spec.needs_gstreamer and system_python and not opencv_has_gstreamer():
        from ..sidecar.capture_client import open_sidecar_capture

        capture, facts = open_sidecar_capture(spec, system_python, max(sidecar_timeout_s, 1.0))
        return CapturedSource(
            spec,
            capture_factory=lambda s: capture,
            where={**facts, "sidecar": True},
            allocate_frame=allocate_frame,
            send_frame=send_frame,
            **kwargs,
        )
    check_openable(spec)
    return CapturedSource(spec, allocate_frame=allocate_frame, send_frame=send_frame, **kwargs)  # type: ignore[arg-type]
