"""The frame graphs (runtime/frame_graph.py) against the fake driver (tests/fixtures/fake_libcuda.c), whose
recording, graphs and box copy work on host memory: a graph replays the copies it recorded, from the addresses it
recorded, reading what is there when it is launched. What TVM's kernels add to a graph needs a GPU:
bench/gpu_pipeline.py checks the agent's top k with graphs against the CPU path's on every frame there."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import numpy as np
import pytest

from edgedeploy_agent.runtime.cuda_copy import BoxCopy, QueueMark, box_params
from edgedeploy_agent.runtime.frame_graph import FrameGraphs
from tests.agent.doubles import fake_libcuda

SHAPE, BOX = (2, 8, 10, 3), (1, 2, 6, 5)  # a batch of two 8x10 frames, a 6x5 box at (1, 2)


class Driver:
    """The fake driver's counters, and one lent batch with its device buffer (host memory here)."""

    def __init__(self, tmp: Path) -> None:
        self.lib = fake_libcuda(tmp, 11040, 72, "Xavier", integrated=False)
        self._dll = ctypes.PyDLL(self.lib)
        self.frames = np.random.default_rng(0).integers(0, 256, SHAPE, dtype=np.uint8)
        self.device = np.zeros((SHAPE[0], BOX[2], BOX[3], 3), np.uint8)
        self.params = box_params(self.frames.ctypes.data, self.device.ctypes.data, SHAPE, BOX)
        self.copy = BoxCopy(self.lib)

    def count(self, name: str) -> int:
        return int(ctypes.c_int.in_dll(self._dll, name).value)

    def set(self, name: str, value: int) -> None:
        ctypes.c_int.in_dll(self._dll, name).value = value

    def box(self) -> np.ndarray:
        top, left, height, width = BOX
        return self.frames[:, top : top + height, left : left + width]

    def queue(self, stream: int) -> None:
        assert self.copy(self.params, stream=stream), self.copy.failure


@pytest.fixture
def driver(tmp_path: Path) -> Driver:
    return Driver(tmp_path)


def test_the_first_call_is_the_callers_then_a_graph_replays_the_copy(driver: Driver) -> None:
    graphs = FrameGraphs(driver.lib)
    assert not graphs.run("batch", driver.queue)  # the caller's own, call by call
    assert len(graphs) == 0 and driver.count("fake_graph_launches") == 0
    assert graphs.run("batch", driver.queue)  # recorded, then launched
    assert np.array_equal(driver.device, driver.box())
    assert (len(graphs), driver.count("fake_execs_alive"), driver.count("fake_graphs_alive")) == (1, 1, 0)
    for value in (7, 200):  # the next frames in the same batch: the graph reads them at launch, nothing recorded
        driver.frames[...] = value
        assert graphs.run("batch", lambda _: pytest.fail("recorded again"))
        assert (driver.device == value).all()
    assert driver.count("fake_graph_launches") == 3 and graphs.failure is None
    assert (graphs.recorded, graphs.launches) == (1, 3)  # what the runtime's describe() says


def test_recordings_are_relaxed_so_that_the_pool_may_allocate(driver: Driver) -> None:
    """CU_STREAM_CAPTURE_MODE_RELAXED (2): in thread-local mode the driver refused the VM pool's allocation during a
    recording, and the pool answered by freeing every buffer it cached, scratch memory of graphs recorded before
    included (H200, 2026-12-07: MobileNetV1-0.25's graphs could not be recorded)."""
    graphs = FrameGraphs(driver.lib)
    graphs.run("batch", driver.queue)
    assert graphs.run("batch", driver.queue) and driver.count("fake_capture_mode") == 2


def test_recording_queues_nothing_until_the_launch(driver: Driver) -> None:
    graphs = FrameGraphs(driver.lib)
    graphs.run("batch", driver.queue)
    assert graphs.capture("batch", driver.queue)
    assert not driver.device.any()  # recorded, not run
    assert graphs.launch("batch") and np.array_equal(driver.device, driver.box())


def test_a_refused_recording_leaves_no_graph_and_is_not_tried_again(driver: Driver) -> None:
    graphs = FrameGraphs(driver.lib)
    driver.set("fake_refuse_recording", 1)
    assert not graphs.run("batch", driver.queue)
    assert not graphs.run("batch", driver.queue)  # the recording ended invalidated: the caller queues the frame
    assert graphs.failure == "recording a frame graph (cuStreamEndCapture) failed with CUresult 901"
    assert not driver.device.any()  # the recorded copy never ran: the caller's own does
    driver.set("fake_refuse_recording", 0)
    assert not graphs.run("batch", pytest.fail)  # not tried again
    assert (driver.count("fake_graphs_alive"), driver.count("fake_execs_alive")) == (0, 0)


def test_a_queue_that_raises_ends_the_recording(driver: Driver) -> None:
    """TVM raises when the driver refuses a call of its own while recording (the wheel's backend launching its graph
    into the recording): the recording is ended and thrown away, the stream usable again."""
    graphs = FrameGraphs(driver.lib)

    def refused(stream: int) -> None:
        driver.queue(stream)
        raise RuntimeError("CUDA: operation not permitted when stream is capturing\n(more lines)")

    graphs.run("batch", driver.queue)
    assert not graphs.run("batch", refused)
    why = "recording a frame graph: RuntimeError: CUDA: operation not permitted when stream is capturing"
    assert graphs.failure == why
    assert (driver.count("fake_graphs_alive"), driver.count("fake_execs_alive")) == (0, 0)
    assert driver.copy(driver.params) and np.array_equal(driver.device, driver.box())  # nothing left recording


def test_a_retired_key_loses_its_graph_and_starts_over(driver: Driver) -> None:
    """A lent batch given back: its graph (holding its addresses) goes at the next call on the owning thread, and a
    new batch at the same address starts with the caller's own call."""
    graphs = FrameGraphs(driver.lib)
    graphs.run("a", driver.queue)
    graphs.run("a", driver.queue)
    graphs.run("b", driver.queue)
    graphs.run("b", driver.queue)
    assert driver.count("fake_execs_alive") == 2
    retire = threading.Thread(target=graphs.retire, args=("a",))  # as weakref.finalize may: another thread
    retire.start()
    retire.join()
    assert "a" not in graphs  # never launched again, at once
    assert driver.count("fake_execs_alive") == 2  # destroyed on the owning thread, not the finaliser's
    assert graphs.run("b", pytest.fail) and driver.count("fake_execs_alive") == 1
    assert not graphs.run("a", pytest.fail)  # a new batch at the same address: the caller's own call first
    graphs.retire("never recorded")  # nothing happens
    graphs.retire("b")
    graphs.close()  # a retired graph not yet destroyed goes with the rest
    assert driver.count("fake_execs_alive") == 0
    assert graphs.recorded == 2 and len(graphs) == 0  # the count keeps the retired ones


def test_ready_tells_the_caller_beforehand_whether_run_launches_a_graph(driver: Driver) -> None:
    """A whole frame's caller queues something before the graph (the wait for a box sent ahead): `ready` says
    whether `run` replays or records now, counting the key's first call as the caller's own, as `run` does."""
    graphs = FrameGraphs(driver.lib)
    assert not graphs.ready("batch")  # its first call: the caller's
    assert graphs.ready("batch") and graphs.run("batch", driver.queue)  # recorded and launched
    assert graphs.ready("batch") and graphs.run("batch", pytest.fail)  # replayed
    assert not graphs.ready("other") and graphs.ready("other")
    driver.set("fake_refuse_recording", 1)
    assert not graphs.run("other", driver.queue)  # ready, but the recording was refused: the caller's own
    assert not graphs.ready("batch") and not graphs.ready("third")  # nothing after a failure


def test_a_mark_recorded_into_a_graph_is_recorded_at_each_launch(driver: Driver) -> None:
    """The whole frame's graph holds the queue mark as an event node (QueueMark.mark_in: CU_EVENT_RECORD_EXTERNAL
    while recording): each launch records the event after the work before it, so `wait` waits for that. Outside
    a recording the external record is refused, and the mark itself goes on working."""
    graphs, mark = FrameGraphs(driver.lib), QueueMark(driver.lib)

    def queue(stream: int) -> None:
        driver.queue(stream)
        mark.mark_in(stream)

    graphs.ready("batch")
    assert graphs.run("batch", queue) and graphs.run("batch", pytest.fail)
    assert driver.count("fake_event_node_records") == 2 and driver.count("fake_graph_launches") == 2
    assert np.array_equal(driver.device, driver.box())
    mark.wait()
    assert driver.count("fake_event_syncs") == 1 and mark.failure is None
    with pytest.raises(RuntimeError, match="cuEventRecordWithFlags .* CUresult 1"):
        mark.mark_in(0)  # the legacy stream, not recorded
    assert mark.failure is None and mark.mark()
    graphs.close()
    mark.close()
    assert (driver.count("fake_execs_alive"), driver.count("fake_events_alive")) == (0, 0)


def test_a_driver_without_external_event_records_gives_up_whole_frame_graphs(driver: Driver) -> None:
    """Before CUDA 11.1 (or a driver that refuses it) the mark cannot be part of a graph: the recording is thrown
    away, the graphs say why and are not tried again; the caller queues the frame the usual way, mark included."""
    graphs, mark = FrameGraphs(driver.lib), QueueMark(driver.lib)
    driver.set("fake_external_records", 0)

    def queue(stream: int) -> None:
        driver.queue(stream)
        mark.mark_in(stream)

    graphs.ready("batch")
    assert not graphs.run("batch", queue)
    assert graphs.failure == "recording a frame graph: RuntimeError: cuEventRecordWithFlags (external, while " \
        "recording) failed with CUresult 1"  # fmt: skip
    assert not driver.device.any() and driver.count("fake_graphs_alive") == 0
    assert not graphs.ready("batch") and mark.failure is None and mark.mark()


def test_closing_destroys_the_graphs_and_the_stream(driver: Driver) -> None:
    graphs = FrameGraphs(driver.lib)
    for key in ("a", "b", "a", "b"):
        graphs.run(key, driver.queue)
    assert (driver.count("fake_execs_alive"), driver.count("fake_streams_alive")) == (2, 1)
    graphs.close()
    assert (driver.count("fake_execs_alive"), driver.count("fake_streams_alive")) == (0, 0)
    assert len(graphs) == 0
    graphs.close()  # twice: nothing left
    assert driver.count("fake_streams_alive") == 0
