"""Several sources, one agent: the newest frame of each source, batched into one inference call.

Each source keeps its own capture thread, reconnects and backoff (sources/capture.py), its own report window
(one report per source per window: per-stage latencies, frame latency, fps, drops, camera state) and its own
entry in health.json; a lost camera gives no frames and the others go on. The batcher takes at most one frame per
source per call: the newest one (a live source replaces a frame that was not taken in time and counts it as
dropped). Once a batch holds a frame it waits at most `max_batch_wait_ms` (agent config) for the other sources,
then runs what it holds, the rest of the compiled batch zero-padded, and splits the outputs back per source.
Sources are taken round-robin from the one after the last served, so with more sources than the batch (a batch 1
bundle: one source per call) every source gets its turn.

A bundle that preprocesses on the GPU (runtime.frames_on_device) gets a call's frames, when they share a
resolution, copied into the runtime's page-locked frame batch, then loaded, preprocessed and run on the GPU in one
call (run_frames_top: one CUDA graph where the runtime can); where its library computes the top k, only that comes
back. Otherwise each frame goes through preprocess.py, one after the
other.
"""

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .aligned import aligned_empty
from .errors import AgentError, FrameFailed
from .loop import (
    READ_TIMEOUT_S,
    InferenceLoop,
    ReportWindow,
    labelled,
    load_inputs,
    output_problem,
    run_preprocessed,
    top_k,
)
from .preprocess import preprocess
from .report import BATCH_STAGES, BatchReport, Prediction
from .sources.capture import CapturedSource, Frame


class Lane:
    """One source of a multi-source agent: its capture, its report window and its counters."""

    def __init__(self, source: CapturedSource) -> None:
        self.source = source
        self.window = LaneWindow()
        self.frames = 0  # frames served since the agent started (the frame index in its predictions)
        self.dropped_before = 0
        self.finished = False  # its source ended and its final report is written


class LaneWindow(ReportWindow):
    """A source's report window, plus the fill of the call each frame was in."""

    def __init__(self) -> None:
        super().__init__(BATCH_STAGES)
        self.fills: list[int] = []


@dataclass
class Taken:
    lane: Lane
    frame: Frame
    capture_ms: float  # from the start of gathering this batch until the frame was taken
    at: float  # time.perf_counter() when it was taken


class Batcher:
    """Gathers up to `size` frames, at most one (the newest) per source."""

    def __init__(self, lanes: Sequence[Lane], size: int, max_wait_s: float) -> None:
        self.lanes, self.size, self.max_wait_s = list(lanes), size, max_wait_s
        self._changed = threading.Event()
        for lane in self.lanes:
            lane.source.on_change = self._changed.set
        self._next = 0

    def gather(self, timeout_s: float, limit: Optional[int] = None) -> list[Taken]:
        """Frames for one call: returns when the batch is full, every source still playing (camera up) gave one,
        the first frame waited max_wait_s, or (nothing taken) after timeout_s."""
        want = min(self.size, limit) if limit is not None else self.size
        start = time.perf_counter()
        deadline = start + timeout_s
        taken: list[Taken] = []
        n = len(self.lanes)
        while True:
            self._changed.clear()  # before looking: a frame that arrives meanwhile sets it again
            for k in range(n):
                if len(taken) >= want:
                    break
                i = (self._next + k) % n
                lane = self.lanes[i]
                if any(t.lane is lane for t in taken):
                    continue
                frame = lane.source.read(timeout=0)
                if frame is not None:
                    now = time.perf_counter()
                    if not taken:
                        deadline = now + self.max_wait_s
                    taken.append(Taken(lane, frame, (now - start) * 1e3, now))
            if taken:
                last = self.lanes.index(taken[-1].lane)
                self._next = (last + 1) % n
            # a source is waited for while it plays and has not given its frame: not once it ended, nor while
            # its camera is down (a lost camera costs the others no batch wait)
            waiting = [
                lane
                for lane in self.lanes
                if all(t.lane is not lane for t in taken) and not lane.source.ended and lane.source.state().camera_up
            ]
            remaining = deadline - time.perf_counter()
            if len(taken) >= want or remaining <= 0:
                return taken
            if not waiting and (taken or all(lane.source.ended for lane in self.lanes)):
                return taken  # (nothing taken, cameras down: wait for one to come back until the timeout)
            self._changed.wait(remaining)


class MultiSourceLoop(InferenceLoop):
    """The inference loop of an agent with several sources, or a bundle compiled for a batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lanes: list[Lane] = []
        self._frame_batches: dict[tuple[int, ...], np.ndarray] = {}  # frame shape -> the runtime's page-locked batch

    def stats(self) -> dict[str, Any]:
        """InferenceLoop's, plus each source's frames and camera state (health.json's `sources`)."""
        out = super().stats()
        out["sources"] = [lane_health(lane) for lane in self.lanes]
        return out

    def serve(self, sources: Sequence[CapturedSource], max_frames: Optional[int] = None) -> int:
        """Serve all sources until every one ended (files), a stop is requested or max_frames; returns reports."""
        self.lanes = [Lane(s) for s in sources]
        spec = self.manifest.inputs[0]
        batch = Batcher(self.lanes, spec.shape[0], self.cfg.max_batch_wait_ms / 1e3)
        x = getattr(self.runtime, "input_array", None)  # a GPU runtime's page-locked input: no copy before the upload
        if x is None:
            x = aligned_empty(tuple(spec.shape), spec.dtype)  # one input buffer for every call
        served, reports = 0, 0
        self._count = 0
        while not self.stop_requested:
            t_window = time.monotonic()
            self.power.start_window()
            for lane in self.lanes:
                lane.window = LaneWindow()
            ended = False
            while not self.stop_requested and time.monotonic() - t_window < self.cfg.report_interval_s:
                if self._tick(served, max_frames):
                    ended = True
                    break
                t0 = time.perf_counter()
                taken = batch.gather(READ_TIMEOUT_S, None if max_frames is None else max_frames - served)
                if not taken:
                    if all(lane.source.ended for lane in self.lanes):
                        ended = True
                        break
                    continue  # no frame from any source yet (cameras lost or slow): feed the watchdog, wait again
                infer_ms = self._serve_batch(x, taken)
                served += len(taken)
                self._progress(len(taken), infer_ms, time.perf_counter() - t0)
            reports += self._report_window(time.monotonic() - t_window, ended)
            up = sum(1 for lane in self.lanes if lane.source.state().camera_up)
            self.notifier.status(f"{up} of {len(self.lanes)} cameras up, {served} frames, {reports} reports")
            if ended:
                break
        return reports

    def _serve_batch(self, x: np.ndarray, taken: list[Taken]) -> float:
        """preprocess each frame into its row of x -> one call -> postprocess each row; returns the call's ms.

        Any failure is a FrameFailed naming the stage and the frames."""
        stage = "preprocessing"
        t_closed = time.perf_counter()
        try:
            on_device = len({t.frame.image.shape for t in taken}) == 1 and getattr(
                self.runtime, "frames_on_device", False
            )
            frames, pre_ms = self._fill_frames(taken) if on_device else (None, self._preprocess(x, taken))
            t_load = time.perf_counter()
            loaded = on_device or load_inputs(self.runtime, x)  # the CPU path's batch to the device, queued
            # on the device the batch's load, preprocessing and model are one call (one graph): its failure is either
            stage = "preprocessing and inference on the GPU" if on_device else "inference"
            t_infer = time.perf_counter()
            pre_ms = [ms + (t_infer - t_load) * 1e3 for ms in pre_ms]
            ages = [t.frame.age_ms for t in taken]
            checked = self._count < self.health_frames
            tops = None  # the top k of each row, computed on the device: (N, 2, k) scores and classes
            if loaded:  # the preprocess stage ends when the GPU's copy and preprocessing did (run_preprocessed)
                tops, outs, preprocessed = run_preprocessed(self.runtime, outputs=checked, frames=frames)
                if preprocessed is not None:
                    pre_ms = [ms + (preprocessed - t_infer) * 1e3 for ms in pre_ms]
                    t_infer = preprocessed
            else:
                outs = self.runtime.run([x])
            infer_ms = (time.perf_counter() - t_infer) * 1e3
            gpu_ms = getattr(self.runtime, "model_gpu_ms", None) if loaded else None  # the batch's, if sampled
            problem = output_problem(outs, self.manifest) if checked else None
            if problem:
                raise FrameFailed(f"{_frames(taken)}: {problem}")
            stage = "postprocessing"
            for i, t in enumerate(taken):
                t0 = time.perf_counter()
                if tops is None:
                    top = top_k(outs[0][i], self.manifest, self.labels)
                else:
                    top = labelled(tops[i, 1], tops[i, 0], self.manifest, self.labels)
                post_ms = (time.perf_counter() - t0) * 1e3
                lane, w = t.lane, t.lane.window
                w.add(ages[i], t.capture_ms, (t_closed - t.at) * 1e3, pre_ms[i], infer_ms, post_ms)
                w.latency_ms.append(t.frame.age_ms)  # captured -> its prediction
                if gpu_ms is not None:
                    w.model_gpu_ms.append(gpu_ms)
                w.fills.append(len(taken))
                if self.cfg.record_predictions:
                    w.predictions.append(Prediction(frame=lane.frames, top=top))
                lane.frames += 1
            return infer_ms
        except AgentError:
            raise
        except Exception as e:  # a runtime fails in its FFI with any error type
            raise FrameFailed(f"{_frames(taken)}: {stage} failed: {type(e).__name__}: {e}") from e

    def _preprocess(self, x: np.ndarray, taken: list[Taken]) -> list[float]:
        """preprocess.py, each frame into its row of x, the rows no source filled zeroed; each frame's ms."""
        spec, pp = self.manifest.inputs[0], self.manifest.preprocess
        pre_ms = []
        for i, t in enumerate(taken):
            t0 = time.perf_counter()
            x[i] = preprocess(t.frame.image, pp, spec)[0]
            pre_ms.append((time.perf_counter() - t0) * 1e3)
        x[len(taken) :] = 0  # padding: rows no source filled in this call
        return pre_ms

    def _fill_frames(self, taken: list[Taken]) -> tuple[np.ndarray, list[float]]:
        """Frames of one resolution into the runtime's page-locked frame batch, each into its row (the rows no
        source filled zeroed), for run_preprocessed to load, preprocess and run in one go; the batch, and each
        frame's copy in ms."""
        shape = taken[0].frame.image.shape
        frames = self._frame_batches.get(shape)
        if frames is None:
            frames = self._frame_batches[shape] = self.runtime.frame_batch(*shape[:2])  # type: ignore[attr-defined]
        copy_ms = []
        for i, t in enumerate(taken):
            t0 = time.perf_counter()
            frames[i] = t.frame.image
            copy_ms.append((time.perf_counter() - t0) * 1e3)
        frames[len(taken) :] = 0
        return frames, copy_ms

    def _report_window(self, seconds: float, ended: bool) -> int:
        """One report per source that served frames or lost its camera; returns how many were written."""
        total = sum(lane.window.frames for lane in self.lanes)
        power = self.power.end_window(total)  # the device's power: the same in every source's report
        written = 0
        for lane in self.lanes:
            w, state = lane.window, lane.source.state()
            final = ended or lane.source.ended
            if lane.finished or not (w.frames or not state.camera_up or final):
                continue
            lane.finished = lane.source.ended
            dropped = state.dropped_frames - lane.dropped_before
            lane.dropped_before = state.dropped_frames
            batch = BatchReport(
                size=self.manifest.inputs[0].shape[0],
                sources=len(self.lanes),
                max_wait_ms=self.cfg.max_batch_wait_ms,
                mean_fill=round(sum(w.fills) / len(w.fills), 3) if w.fills else 0.0,
                aggregate_fps=round(total / seconds, 3) if seconds > 0 else 0.0,
            )
            fps = round(w.frames / seconds, 3) if seconds > 0 else 0.0
            report = self._report(w, lane.source.uri, state, final, dropped, power, fps=fps, batch=batch)
            self._emit(report)
            written += 1
        return written


def lane_health(lane: Lane) -> dict[str, Any]:
    """One source's line in health.json."""
    state = lane.source.state()
    return {
        "source": lane.source.uri,
        "frames": lane.frames,
        "camera_up": state.camera_up,
        "ended": lane.source.ended,
        "reconnects": state.reconnects,
        "dropped_frames": state.dropped_frames,
        "last_error": state.last_error,
    }


def _frames(taken: list[Taken]) -> str:
    return ", ".join(f"frame {t.lane.frames} from {t.lane.source.uri}" for t in taken)
