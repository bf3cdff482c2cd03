"""Frame source URIs and the capture thread: every file frame in order, latest-only live frames,
reconnect with backoff after a loss, and a clear refusal of GStreamer URIs on an OpenCV without it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import pytest

from edgedeploy_agent.errors import SourceError
from edgedeploy_agent.sources.capture import CapturedSource, open_source
from edgedeploy_agent.sources.frames import check_openable, has_gstreamer, parse_source
from tests.agent.clips import write_clip
from tests.agent.doubles import PacedCapture
from tests.helpers import require, require_gstreamer_python

REPO = Path(__file__).resolve().parents[2]


def test_uris_parse_to_backends_and_pipelines() -> None:
    v = parse_source("v4l2:/dev/video2?width=1280&height=720&fps=30")
    assert (v.target, v.backend, v.live) == ("/dev/video2", cv2.CAP_V4L2, True)
    assert v.props[cv2.CAP_PROP_FRAME_WIDTH] == 1280 and v.props[cv2.CAP_PROP_BUFFERSIZE] == 1
    c = parse_source("csi:1?width=1920&height=1080&fps=30")
    assert c.target.startswith("nvarguscamerasrc sensor-id=1 ! video/x-raw(memory:NVMM),width=1920,height=1080")
    assert c.target.endswith("appsink drop=true max-buffers=1 sync=false") and c.needs_gstreamer
    assert parse_source("rtsp://cam.local/stream1").backend == cv2.CAP_FFMPEG
    g = parse_source("gst:videotestsrc ! video/x-raw,width=64,height=48")
    assert g.target.endswith("format=BGR ! appsink drop=true max-buffers=1 sync=false")
    f = parse_source("file:/data/clip.mp4?loop=1")
    assert (f.target, f.loop, f.live, f.fps) == ("/data/clip.mp4", True, False, None)
    assert parse_source("file:/data/clip.mp4?loop=1&fps=25").fps == 25
    assert parse_source("file:///data/clip.mp4").target == "/data/clip.mp4"


@pytest.mark.parametrize(
    "uri", ["camera0", "http://x/y.mjpg", "csi:left", "v4l2:/dev/video0?width=wide", "file:", "file:/a.avi?fps=0"]
)
def test_bad_uris_are_refused_with_the_valid_forms(uri: str) -> None:
    with pytest.raises(SourceError) as e:
        parse_source(uri)
    assert uri in e.value.message


def test_gstreamer_detection_from_build_information() -> None:
    assert not has_gstreamer(
        "  Video I/O:\n    DC1394:    NO\n    FFMPEG:   YES\n    GStreamer:                   NO\n"
    )
    assert not has_gstreamer("    GStreamer:                   NO\n")
    assert has_gstreamer("    GStreamer:                   YES (1.22.0)\n")
    with pytest.raises(SourceError, match="built without it") as e:
        check_openable(parse_source("csi:0"), gstreamer=False)
    assert "--system-python" in (e.value.hint or "")


def test_a_file_plays_every_frame_once_in_order(tmp_path: Path) -> None:
    src = open_source(f"file:{write_clip(tmp_path / 'a.avi', 12, 40)}")
    try:
        got = []
        while (f := src.read(timeout=5)) is not None:
            got.append(f.index)
            time.sleep(0.005)  # a slow consumer never loses file frames
        assert got == list(range(12))
        assert src.ended and src.state().dropped_frames == 0
    finally:
        src.close()


def test_a_file_at_fps_n_is_played_at_that_rate_and_loops_on(tmp_path: Path) -> None:
    """fps=20: 14 frames (a 6-frame clip looped) take at least 13 periods, every frame still handed over in order."""
    src = open_source(f"file:{write_clip(tmp_path / 'a.avi', 6, 40)}?loop=1&fps=20")
    try:
        first = src.read(timeout=5)
        assert first is not None
        got = [first.index]
        while len(got) < 14:
            frame = src.read(timeout=5)
            assert frame is not None
            got.append(frame.index)
        assert got == list(range(14)) and time.monotonic() - first.captured >= 13 / 20 - 0.01
    finally:
        src.close()


def test_a_corrupt_file_is_a_source_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.avi"
    bad.write_bytes(b"not a video at all" * 100)
    with pytest.raises(SourceError, match="cannot open"):
        open_source(f"file:{bad}")


def test_live_source_lost_then_recovers(tmp_path: Path) -> None:
    """A live file ends (the camera is lost), is gone for a while, then comes back."""
    clip = write_clip(tmp_path / "cam.avi", 10, 40)
    src = open_source(f"file:{clip}?live=1", backoff_start_s=0.05, backoff_max_s=0.2)
    try:
        first = src.read(timeout=5)
        # (not `camera_up` here: the unpaced reader may already be past the clip's end, between reopens)
        assert first is not None and src.state().frames_captured >= 1
        clip.unlink()  # the device disappears: reopening fails until it is back
        deadline = time.monotonic() + 5
        while src.state().camera_up and time.monotonic() < deadline:
            src.read(timeout=0.05)
        down = src.state()
        assert not down.camera_up
        assert down.last_error and str(clip) in down.last_error
        # no frame, but not ended: keep waiting. The failed reopens meanwhile (every 0.05-0.2 s) are no
        # reconnects. (Not `reconnects == 0`: the unpaced reader can reach the end of the 10 frames and reopen
        # the clip before it is unlinked, a reconnect; seen once in CI, under load.)
        assert src.read(timeout=0.5) is None and not src.ended
        assert src.state().reconnects == down.reconnects and not src.state().camera_up
        # plugged back in, brighter frames. Written beside it and renamed: the reader retries every 0.2 s and
        # could otherwise open the clip half-written
        write_clip(tmp_path / "next.avi", 10, 150).rename(clip)
        frame = src.read(timeout=5)
        assert frame is not None and frame.image.mean() > 140
        # The reader is unpaced: a 10-frame clip can end (camera down again, then reopened: reconnects 2) before
        # state() is read, so this waits for an "up" state rather than assuming one
        deadline = time.monotonic() + 5
        while not src.state().camera_up and time.monotonic() < deadline:
            src.read(timeout=0.05)
        up = src.state()
        assert up.camera_up and up.reconnects > down.reconnects and up.frames_captured > down.frames_captured
    finally:
        src.close()


def test_live_source_keeps_only_the_latest_frame(tmp_path: Path) -> None:
    clip = write_clip(tmp_path / "cam.avi", 200, 0)
    src = open_source(f"file:{clip}?live=1", backoff_start_s=5.0)
    try:
        a = src.read(timeout=5)
        time.sleep(0.3)  # the reader runs on; a slow consumer sees the newest frame, not a backlog
        b = src.read(timeout=5)
        assert a is not None and b is not None and b.index > a.index + 1
        assert src.state().dropped_frames >= b.index - a.index - 1
    finally:
        src.close()


def test_close_stops_the_capture_thread(tmp_path: Path) -> None:
    src = open_source(f"file:{tmp_path / 'never.avi'}?live=1", backoff_start_s=10.0)
    assert isinstance(src, CapturedSource)
    t = time.monotonic()
    src.close()
    assert time.monotonic() - t < 2.0  # the backoff sleep wakes on close


GST_SCRIPT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from edgedeploy_agent.sources.capture import open_source
src = open_source("gst:videotestsrc num-buffers=20 is-live=true ! video/x-raw,width=64,height=48,framerate=30/1",
                  backoff_start_s=0.1)
seen, deadline = 0, time.monotonic() + 10
while time.monotonic() < deadline and not (seen > 25 and src.state().reconnects >= 1):
    f = src.read(timeout=0.5)
    if f is not None:
        assert f.image.shape == (48, 64, 3)
        seen += 1
s = src.state()
src.close()
print(seen, s.reconnects, s.camera_up)
"""


def test_gst_videotestsrc_pipeline_with_debian_opencv(tmp_path: Path) -> None:
    """Debian's python3-opencv has GStreamer: a pipeline that ends after 20 buffers is reopened."""
    py = require_gstreamer_python()
    script = tmp_path / "gst_probe.py"
    script.write_text(GST_SCRIPT)
    p = subprocess.run([py, str(script), str(REPO / "agent")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    seen, reconnects, up = p.stdout.split()
    assert int(seen) > 25 and int(reconnects) >= 1 and up == "True"


def test_pip_opencv_refuses_gstreamer_uris_clearly() -> None:
    require("NO_GSTREAMER", "this OpenCV has GStreamer" if has_gstreamer(cv2.getBuildInformation()) else None)
    with pytest.raises(SourceError, match="needs OpenCV with GStreamer"):
        open_source("gst:videotestsrc")
    assert sys.modules["cv2"].__version__


def _decoded(path: Path) -> list:
    cap = cv2.VideoCapture(str(path))
    frames = []
    while (ok_frame := cap.read())[0]:
        frames.append(ok_frame[1])
    cap.release()
    return frames


class _Lender:
    """Lends uint8 frame buffers as a GPU runtime's frame_batch does, and remembers them."""

    def __init__(self) -> None:
        self.lent: list = []

    def __call__(self, height: int, width: int) -> object:
        import numpy as np

        self.lent.append(np.zeros((height, width, 3), np.uint8))
        return self.lent[-1]

    def owns(self, image: object) -> bool:
        return any(image is b for b in self.lent)


def test_a_file_decodes_into_lent_buffers(data_dir: Path) -> None:
    """A real 720p video: from the second frame on OpenCV writes into the three buffers the consumer lent, every
    frame arrives whole and in order, and none is copied."""
    import numpy as np

    video = data_dir / "video" / "bigbuckbunny.mp4"
    want = _decoded(video)
    lender = _Lender()
    src = open_source(f"file:{video}", allocate_frame=lender)
    try:
        got = []
        while (f := src.read(timeout=5)) is not None:
            assert np.array_equal(f.image, want[f.index]), f"frame {f.index}"
            got.append((f.index, lender.owns(f.image)))
    finally:
        src.close()
    assert [i for i, _ in got] == list(range(len(want)))
    assert len(lender.lent) == 3 and all(lent for _, lent in got[1:]) and not got[0][1]
    assert src.copied == 0


def test_a_live_source_never_overwrites_the_frame_the_consumer_holds(data_dir: Path) -> None:
    """Latest-frame-only with lent buffers: while the consumer holds a frame (and the newest one waits), the
    decoder writes only into the third buffer, so the held frame is still the one decoded at its index."""
    import numpy as np

    video = data_dir / "video" / "bikes.mp4"
    want = _decoded(video)
    lender = _Lender()
    src = open_source(f"file:{video}?live=1", allocate_frame=lender, backoff_start_s=10.0)
    try:
        checked = 0
        while checked < 10 and (f := src.read(timeout=5)) is not None:
            time.sleep(0.005)  # the capture thread decodes several frames meanwhile
            assert np.array_equal(f.image, want[f.index]), f"frame {f.index} changed while held"
            checked += 1 if lender.owns(f.image) else 0
        assert checked == 10 and src.state().dropped_frames > 0  # frames were replaced, never the held one
    finally:
        src.close()


def test_a_decoder_that_writes_elsewhere_is_copied_into_the_lent_buffer(tmp_path: Path) -> None:
    """A capture that allocates its own frames (as OpenCV does for another size, or a sidecar without a buffer):
    each frame is copied into a lent buffer, and counted."""
    import numpy as np

    from edgedeploy_agent.sources.frames import CvCapture

    class OwnArrays(CvCapture):
        def read(self, out: object = None) -> object:
            return super().read()  # never into `out`

    clip = write_clip(tmp_path / "c.avi", 6, 40)
    lender = _Lender()
    src = CapturedSource(parse_source(f"file:{clip}"), capture_factory=OwnArrays, allocate_frame=lender)
    try:
        frames = []
        while (f := src.read(timeout=5)) is not None:
            frames.append((f.index, lender.owns(f.image), f.image.copy()))
    finally:
        src.close()
    assert [i for i, _, _ in frames] == list(range(6)) and all(lent for _, lent, _ in frames[1:])
    assert src.copied == 5
    assert all(np.array_equal(img, want) for (_, _, img), want in zip(frames, _decoded(clip), strict=True))


def test_each_frame_decoded_into_a_lent_buffer_is_sent_on_before_it_is_handed_over(tmp_path: Path) -> None:
    """send_frame (a GPU runtime's send_frames) gets each lent buffer once the decoder filled it, on the capture
    thread, before the consumer can take that frame: when the consumer reads frame i, the buffer was sent holding
    frame i. The first frame (decoded before the buffers existed) is not lent, so not sent."""
    import numpy as np

    clip = write_clip(tmp_path / "c.avi", 8, 40)
    want = _decoded(clip)
    lender, sent = _Lender(), []

    def send(image: object) -> bool:
        assert threading.current_thread().name.startswith("capture") and lender.owns(image)
        sent.append((id(image), image.copy()))  # type: ignore[attr-defined]
        return True

    src = open_source(f"file:{clip}", allocate_frame=lender, send_frame=send)
    try:
        got = []
        while (f := src.read(timeout=5)) is not None:
            if f.index > 0:  # (the capture thread may have sent frame i + 1 already: it decodes while we hold i)
                assert len(sent) >= f.index, f"frame {f.index} was handed over before it was sent"
                assert sent[f.index - 1][0] == id(f.image) and np.array_equal(sent[f.index - 1][1], want[f.index])
            got.append(f.index)
    finally:
        src.close()
    assert got == list(range(8)) and len(sent) == 7 and src.sent == 7


def test_a_send_that_fails_is_not_called_again_and_loses_no_frame(tmp_path: Path) -> None:
    """A send_frame that raises (a driver call failed) stops being called, says why in last_error, and every frame
    still reaches the consumer (which then uploads each itself); one that returns False counts nothing."""
    calls = []

    def broken(image: object) -> bool:
        calls.append(1)
        raise OSError("cuStreamCreate failed")

    for send, error in ((broken, "sending frames on failed: OSError: cuStreamCreate failed"), (lambda _: False, None)):
        src = open_source(f"file:{write_clip(tmp_path / 'c.avi', 5, 40)}", allocate_frame=_Lender(), send_frame=send)
        try:
            got = [f.index for f in iter(lambda: src.read(timeout=5), None)]  # noqa: B023
        finally:
            src.close()
        assert got == list(range(5)) and src.sent == 0 and src.last_error == error
    assert len(calls) == 1


def test_a_consumer_that_cannot_lend_buffers_gets_opencvs_frames(tmp_path: Path) -> None:
    """Lending that fails (page-locked memory ran out) leaves the capture as it was without lending: every frame,
    in OpenCV's own arrays, the reason in last_error."""

    def no_memory(height: int, width: int) -> object:
        raise MemoryError(f"cannot pin {height}x{width}x3")

    src = open_source(f"file:{write_clip(tmp_path / 'c.avi', 5, 40)}", allocate_frame=no_memory)
    try:
        got = [f.index for f in iter(lambda: src.read(timeout=5), None)]
    finally:
        src.close()
    assert got == list(range(5)) and src.copied == 0
    assert src.last_error == "no frame buffers from the runtime: MemoryError: cannot pin 48x64x3"


def naps() -> int:
    """How many times the calling thread has given up its CPU so far (Linux: voluntary context switches)."""
    status = Path("/proc/thread-self/status").read_text()
    return int(next(x for x in status.splitlines() if x.startswith("voluntary_ctxt_switches:")).split()[1])


def _reads(delay_s: float, spin_s: float, frames: int = 4) -> tuple[list[int], float, int]:
    """A file-like source whose frames come delay_s apart, read with `spin_s`: (the frames' indices, the wall seconds
    and the reading thread's naps over the reads after the first)."""
    src = CapturedSource(parse_source("file:paced"), capture_factory=lambda _: PacedCapture(frames, delay_s))
    try:
        got = [src.read(timeout=5, spin_s=spin_s).index]  # type: ignore[union-attr]
        wall, before = time.perf_counter(), naps()
        while (f := src.read(timeout=5, spin_s=spin_s)) is not None:
            got.append(f.index)
        return got, time.perf_counter() - wall, naps() - before
    finally:
        src.close()


def test_a_spinning_read_polls_for_the_frame_and_a_plain_one_sleeps() -> None:
    """frame_spin_ms: a read that spins looks for the frame again and again, napping between looks (a sleep the
    thread's timer slack stretches to tens of us, in which the capture thread may take the GIL to hand the frame
    over), so its
    core never idles for long; one that does not sleeps once until the capture thread wakes it. Both get every
    frame, in order."""
    got, _, slept = _reads(delay_s=0.05, spin_s=1.0)
    assert got == [0, 1, 2, 3] and slept > 100, slept  # three gaps of 50 ms: naps of 50-100 us, not 1.5 ms
    got, _, slept = _reads(delay_s=0.05, spin_s=0.0)
    assert got == [0, 1, 2, 3] and slept < 30, slept


def test_a_spin_shorter_than_the_gap_sleeps_for_the_rest() -> None:
    """A frame that comes after the spin is still handed over (the read sleeps once the spin is spent): the thread
    polls only for the spin, not the whole gap."""
    got, wall, slept = _reads(delay_s=0.2, spin_s=0.01)
    assert got == [0, 1, 2, 3] and wall > 0.5, wall
    long_spin = _reads(delay_s=0.2, spin_s=1.0)[2]
    assert slept < long_spin / 4, (slept, long_spin)


def test_a_spinning_read_keeps_its_timeout_and_sees_the_end() -> None:
    """The timeout bounds the spin (None after it, not after the spin), and a source that ends mid-spin returns
    None at once."""
    src = CapturedSource(parse_source("file:paced"), capture_factory=lambda _: PacedCapture(1, 0.5))
    try:
        t = time.perf_counter()
        assert src.read(timeout=0.05, spin_s=10.0) is None
        assert time.perf_counter() - t < 1.0
    finally:
        src.close()
    src = CapturedSource(parse_source("file:paced"), capture_factory=lambda _: PacedCapture(0, 0.0))
    try:
        t = time.perf_counter()
        assert src.read(timeout=5, spin_s=10.0) is None and src.ended
        assert time.perf_counter() - t < 1.0
    finally:
        src.close()
