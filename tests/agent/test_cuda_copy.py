"""The crop box copy's parameters (runtime/cuda_copy.py): the CUDA_MEMCPY3D layout of cuda.h and, applied with the
driver's documented semantics (below, in numpy), the box of every frame of a batch, densely in the device buffer.
The copy itself needs a GPU: bench/gpu_pipeline.py checks every preprocessed frame against preprocess.py there.
And the model clock's events, the queue mark and the frames sent ahead, against a fake driver."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgedeploy_agent.bundle import Preprocess
from edgedeploy_agent.preprocess import crop_box
from edgedeploy_agent.runtime.cuda_copy import (
    AheadCopy,
    BoxCopy,
    Memcpy3D,
    ModelClock,
    QueueMark,
    box_params,
    load_box_copy,
)
from tests.agent.doubles import fake_libcuda


def test_the_parameters_have_cuda_h_layout() -> None:
    """Offsets as cuda.h's CUDA_MEMCPY3D has them on 64-bit Linux (a C program's offsetof, CUDA 13 headers)."""
    offsets = {"srcMemoryType": 32, "srcHost": 40, "srcPitch": 72, "srcHeight": 80, "dstXInBytes": 88,
               "dstMemoryType": 120, "dstDevice": 136, "dstPitch": 160, "dstHeight": 168, "WidthInBytes": 176,
               "Height": 184, "Depth": 192}  # fmt: skip
    assert ctypes.sizeof(Memcpy3D) == 200
    assert {name: getattr(Memcpy3D, name).offset for name in offsets} == offsets


def apply(p: Memcpy3D, src: np.ndarray, dst: np.ndarray) -> None:
    """cuMemcpy3D on host byte arrays: Depth slices of Height rows of WidthInBytes bytes, each side at its own
    pitch and slice height (srcHost / dstDevice taken as offsets into `src` / `dst`)."""
    for z in range(p.Depth):
        for y in range(p.Height):
            s = (p.srcHost or 0) + ((p.srcZ + z) * p.srcHeight + p.srcY + y) * p.srcPitch + p.srcXInBytes
            d = p.dstDevice + ((p.dstZ + z) * p.dstHeight + p.dstY + y) * p.dstPitch + p.dstXInBytes
            dst[d : d + p.WidthInBytes] = src[s : s + p.WidthInBytes]


@pytest.mark.parametrize("shape", [(1, 72, 128, 3), (3, 27, 64, 3), (2, 64, 48, 3)], ids=str)
def test_the_copy_gives_each_frames_crop_box(shape: tuple[int, int, int, int]) -> None:
    frames = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    box = top, left, height, width = crop_box(shape[1], shape[2], Preprocess(resize="center_crop", crop_fraction=0.875))
    assert (height, width) != shape[1:3]  # a real crop
    device = np.zeros((shape[0], height, width, 3), np.uint8)
    p = box_params(0, 0, shape, box)
    assert (p.srcMemoryType, p.dstMemoryType) == (1, 2)  # host to device
    apply(p, frames.reshape(-1), device.reshape(-1))
    assert np.array_equal(device, frames[:, top : top + height, left : left + width])


def test_a_box_outside_the_frames_is_refused() -> None:
    with pytest.raises(ValueError, match="not inside frames of 72x128"):
        box_params(0, 0, (1, 72, 128, 3), (10, 0, 72, 72))


def test_without_the_driver_there_is_no_box_copy_and_a_reason() -> None:
    copy, why = load_box_copy()
    if copy is not None:
        pytest.skip("this machine has a CUDA driver")
    assert why is not None and "libcuda.so.1" in why
    with pytest.raises(OSError):
        BoxCopy("libcuda-that-is-not-there.so.1")


def test_the_model_clock_reads_start_to_stop_once_per_frame(tmp_path: Path) -> None:
    """Against the fake driver (tests/fixtures/fake_libcuda.c: an event completes when recorded), the clock's calls
    and what a frame that did not mark both events reads."""
    clock = ModelClock(fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200"))
    clock.start()
    time.sleep(0.02)
    clock.stop()
    ms = clock.read()
    assert ms is not None and 20 <= ms < 2000
    assert clock.read() is None  # read once: the next frame marks its own
    clock.stop()
    assert clock.read() is None  # no start in this frame (run() from the host)
    clock.start()
    clock.cancel()
    clock.stop()
    assert clock.read() is None and clock.failure is None


def test_closing_the_model_clock_destroys_its_events(tmp_path: Path) -> None:
    lib = fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200")
    alive = ctypes.c_int.in_dll(ctypes.PyDLL(lib), "fake_events_alive")
    clock = ModelClock(lib)
    assert alive.value == 0  # created on the first sampled frame, not before
    clock.start()
    clock.stop()
    assert clock.read() is not None and alive.value == 2
    clock.close()
    assert alive.value == 0 and clock.failure is None
    clock.close()  # twice: nothing left to destroy
    assert alive.value == 0 and clock.failure is None


def test_the_model_clock_times_one_frame_in_every(tmp_path: Path) -> None:
    """With `every` (the runtime's MODEL_CLOCK_EVERY), only frames 0, every, 2 * every, ... read a time."""
    clock = ModelClock(fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200"), every=4)
    read = []
    for _ in range(10):
        clock.start()
        clock.stop()
        read.append(clock.read() is not None)
    assert [i for i, r in enumerate(read) if r] == [0, 4, 8]


def test_a_refused_event_leaves_the_host_clock_and_says_why(tmp_path: Path) -> None:
    lib = fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200")
    clock = ModelClock(lib)
    ctypes.c_int.in_dll(ctypes.PyDLL(lib), "fake_event_record_result").value = 700
    clock.start()
    clock.stop()
    assert clock.read() is None
    assert clock.failure == "cuEventRecord failed with CUresult 700"


def test_the_queue_mark_records_an_untimed_event_and_waits_for_it(tmp_path: Path) -> None:
    """QueueMark (where a frame's preprocessing ends) against the fake driver: one event, created on the first
    mark, waited for on each `wait`, destroyed on close; a wait before any mark waits for nothing."""
    lib = fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200")
    driver = ctypes.PyDLL(lib)
    alive, syncs = (ctypes.c_int.in_dll(driver, n) for n in ("fake_events_alive", "fake_event_syncs"))
    mark = QueueMark(lib)
    mark.wait()
    assert alive.value == 0 and syncs.value == 0
    for _ in range(3):
        assert mark.mark()
        mark.wait()
    assert alive.value == 1 and syncs.value == 3 and mark.failure is None
    mark.close()
    assert alive.value == 0 and mark.failure is None


def test_a_refused_mark_says_why_and_marks_nothing_more(tmp_path: Path) -> None:
    lib = fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200")
    mark = QueueMark(lib)
    ctypes.c_int.in_dll(ctypes.PyDLL(lib), "fake_event_record_result").value = 700
    assert not mark.mark()
    assert mark.failure == "cuEventRecord failed with CUresult 700"
    ctypes.c_int.in_dll(ctypes.PyDLL(lib), "fake_event_record_result").value = 0
    assert not mark.mark()  # not tried again: the runtime's stages end where the preprocessing is queued


def test_a_frame_sent_ahead_is_copied_on_a_stream_of_its_own_and_waited_for(tmp_path: Path) -> None:
    """AheadCopy against the fake driver (a copy runs when queued there): each batch's box lands in its own device
    buffer; one stream for all, one event per batch; the runtime's stream waits for a batch's event only once that
    batch sent; a retired batch's event is destroyed at the next send, the rest and the stream at close."""
    lib = fake_libcuda(tmp_path, 11040, 72, "Xavier")
    driver = ctypes.PyDLL(lib)
    alive, streams, waits = (
        ctypes.c_int.in_dll(driver, n) for n in ("fake_events_alive", "fake_streams_alive", "fake_stream_waits")
    )
    shape = (1, 72, 128, 3)
    box = top, left, height, width = crop_box(72, 128, Preprocess(resize="center_crop", crop_fraction=0.875))
    rng = np.random.default_rng(1)
    frames = {key: rng.integers(0, 256, shape, dtype=np.uint8) for key in "ab"}
    devices = {key: np.zeros((1, height, width, 3), np.uint8) for key in "ab"}
    ahead = AheadCopy(BoxCopy(lib), lib)
    assert not ahead.take("a") and waits.value == 0  # nothing sent: nothing to wait for
    for key in "ab":
        assert ahead.send(key, box_params(frames[key].ctypes.data, devices[key].ctypes.data, shape, box))
    for key in "ab":
        assert np.array_equal(devices[key], frames[key][:, top : top + height, left : left + width])
    assert streams.value == 1 and alive.value == 2
    assert ahead.take("a") and waits.value == 1
    ahead.retire("a")
    assert alive.value == 2 and not ahead.take("a")  # destroyed on the sending thread, not the finaliser's
    assert ahead.send("b", box_params(frames["b"].ctypes.data, devices["b"].ctypes.data, shape, box))
    assert alive.value == 1
    ahead.close()
    assert alive.value == 0 and streams.value == 0 and ahead.failure is None


def test_a_refused_send_says_why_and_sends_nothing_more(tmp_path: Path) -> None:
    lib = fake_libcuda(tmp_path, 11040, 72, "Xavier")
    frame, device = np.zeros((1, 8, 8, 3), np.uint8), np.zeros((1, 8, 8, 3), np.uint8)
    params = box_params(frame.ctypes.data, device.ctypes.data, frame.shape, (0, 0, 8, 8))
    ahead = AheadCopy(BoxCopy(lib), lib)
    ctypes.c_int.in_dll(ctypes.PyDLL(lib), "fake_event_record_result").value = 700
    assert not ahead.send("a", params)
    assert ahead.failure == "cuEventRecord failed with CUresult 700"
    ctypes.c_int.in_dll(ctypes.PyDLL(lib), "fake_event_record_result").value = 0
    assert not ahead.send("a", params)  # not tried again: the loop copies each box itself from now on
    ahead.close()


def test_a_thread_without_a_context_sends_after_making_the_primary_one_current(tmp_path: Path) -> None:
    """A thread whose first CUDA call is a send (the driver answers 201, no current context) makes the device's
    primary context current and sends, as cudart would: the capture thread of a bench, or of a sidecar."""
    lib = fake_libcuda(tmp_path, 11040, 72, "Xavier")
    ctypes.c_int.in_dll(ctypes.PyDLL(lib), "fake_threads_need_context").value = 1
    frame = np.arange(8 * 8 * 3, dtype=np.uint8).reshape(1, 8, 8, 3)
    ahead = AheadCopy(BoxCopy(lib), lib)
    for key in range(2):  # the stream is made by the first thread; the second makes only its event
        device = np.zeros_like(frame)
        params = box_params(frame.ctypes.data, device.ctypes.data, frame.shape, (0, 0, 8, 8))
        results: list[bool] = []
        thread = threading.Thread(target=lambda r=results, p=params, k=key: r.append(ahead.send(k, p)))
        thread.start()
        thread.join()
        assert results == [True] and ahead.failure is None and np.array_equal(device, frame)
    ahead.close()


def test_take_says_whether_the_batchs_current_fill_was_sent(tmp_path: Path) -> None:
    """What the loop's load_frames asks (AheadCopy.take): True once per send; a fill loaded again without a send
    is the loop's to copy, though its stream still waits for the last copy into the buffer; a batch given back (its
    address may be lent again) or a failure since the send leaves nothing to take."""
    lib = fake_libcuda(tmp_path, 11040, 72, "Xavier")
    driver = ctypes.PyDLL(lib)
    waits = ctypes.c_int.in_dll(driver, "fake_stream_waits")
    frame, device = np.zeros((1, 8, 8, 3), np.uint8), np.zeros((1, 8, 8, 3), np.uint8)
    params = box_params(frame.ctypes.data, device.ctypes.data, frame.shape, (0, 0, 8, 8))
    ahead = AheadCopy(BoxCopy(lib), lib)
    assert ahead.send("a", params) and ahead.take("a") and waits.value == 1
    assert not ahead.take("a") and waits.value == 2  # loaded again, not sent again: copied by the loop, after a wait
    assert ahead.send("a", params)
    ahead.retire("a")
    assert not ahead.take("a")
    assert ahead.send("b", params)
    ctypes.c_int.in_dll(driver, "fake_event_record_result").value = 700
    assert not ahead.send("c", params) and ahead.failure is not None
    assert not ahead.take("b")  # sent before the failure: the loop copies from now on, every fill alike
    ahead.close()
