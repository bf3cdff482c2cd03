"""The preprocessing kernel (compile/preprocess_kernel.py), built for the CPU here, against preprocess.py on real
video frames; the runtime's frame path (load_frames, run_loaded) and its buffers; the bundle's new artifact.

Tolerance: the kernel's resized pixels are OpenCV's bytes exactly (INTER_LINEAR_EXACT, INTER_NEAREST, BGR2GRAY
reproduced in integer arithmetic), and the normalisation rounds as numpy does, so the float32 tensors are equal:
max |difference| 0 here. On the H200 (bench/gpu_pipeline.py, every frame of both videos) the same holds with
CUDA's __fmul_rn/__fadd_rn; the bench prints the max |difference| and the fraction of changed top-1 classes.
"""

from __future__ import annotations

import functools
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgedeploy_agent.bundle import (
    Preprocess,
    TensorSpec,
    describe_artifact,
    extract_bundle,
    read_manifest,
    write_bundle,
)
from edgedeploy_agent.loop import top_k
from edgedeploy_agent.preprocess import crop_box, preprocess, resize_taps

MOBILENET = Preprocess(color="rgb", resize="center_crop", crop_fraction=0.875, mean=[127.5], std=[127.5])
CASES = [
    (MOBILENET, TensorSpec(name="x", shape=[1, 3, 224, 224], layout="NCHW")),
    (
        Preprocess(
            color="rgb",
            resize="center_crop",
            crop_fraction=0.875,
            mean=[123.675, 116.28, 103.53],
            std=[58.395, 57.12, 57.375],
        ),
        TensorSpec(name="x", shape=[1, 3, 224, 224], layout="NCHW"),
    ),
    (
        Preprocess(color="gray", interpolation="nearest", scale=1 / 255),
        TensorSpec(name="x", shape=[2, 28, 28, 1], layout="NHWC"),
    ),
    (
        Preprocess(color="bgr", mean=[1, 2, 3], std=[4, 5, 6]),
        TensorSpec(name="x", shape=[1, 300, 400, 3], layout="NHWC"),
    ),
]


def video_frames(data_dir: Path, name: str, step: int) -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(data_dir / "video" / name))
    frames, i = [], 0
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        if i % step == 0:
            frames.append(frame)
        i += 1
    cap.release()
    assert frames, f"no frames in {name}"
    return frames


def apply_taps(frame: np.ndarray, xtaps: np.ndarray, ytaps: np.ndarray) -> np.ndarray:
    """The kernel's resize arithmetic in numpy."""
    p = frame.astype(np.int64)

    def rows(r: np.ndarray) -> np.ndarray:
        return p[r][:, xtaps[:, 0]] * xtaps[None, :, 2, None] + p[r][:, xtaps[:, 1]] * xtaps[None, :, 3, None]

    v = rows(ytaps[:, 0]) * ytaps[:, 2, None, None] + rows(ytaps[:, 1]) * ytaps[:, 3, None, None]
    return ((v + (1 << 15)) >> 16).astype(np.uint8)


@pytest.mark.parametrize("size", [(224, 224), (120, 160), (400, 300), (79, 79)])
@pytest.mark.parametrize("interpolation", ["linear", "nearest"])
def test_tap_tables_give_opencvs_bytes(data_dir: Path, size: tuple[int, int], interpolation: str) -> None:
    flag = {"linear": cv2.INTER_LINEAR_EXACT, "nearest": cv2.INTER_NEAREST}[interpolation]
    spec = TensorSpec(name="x", shape=[1, 3, *size], layout="NCHW")
    for name in ("bikes.mp4", "bigbuckbunny.mp4"):
        for frame in video_frames(data_dir, name, 50):
            for fraction in (1.0, 0.875):
                pp = Preprocess(resize="center_crop", crop_fraction=fraction, interpolation=interpolation)
                top, left, h, w = box = crop_box(*frame.shape[:2], pp)
                want = cv2.resize(frame[top : top + h, left : left + w], size[::-1], interpolation=flag)
                assert np.array_equal(apply_taps(frame, *resize_taps(box, interpolation, spec)), want)


def test_tap_tables_refuse_area() -> None:
    with pytest.raises(ValueError, match="area"):
        resize_taps((0, 0, 10, 10), "area", TensorSpec(name="x", shape=[1, 3, 4, 4], layout="NCHW"))


def test_area_keeps_the_cpu_path() -> None:
    from edgedeploy.compile.preprocess_kernel import supported

    spec = TensorSpec(name="x", shape=[1, 3, 4, 4], layout="NCHW")
    assert supported(Preprocess(interpolation="area"), spec) == "INTER_AREA is not a two-tap filter"
    assert supported(MOBILENET, spec) is None
    assert supported(MOBILENET, TensorSpec(name="x", shape=[1, 10])) is not None


@pytest.mark.compile
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_equals_cpu_preprocessing_on_video(data_dir: Path, case: int) -> None:
    import tvm

    from edgedeploy.compile.preprocess_kernel import FUNCTION, build

    pp, spec = CASES[case]
    kernel = build(pp, spec, tvm.target.Target({"kind": "llvm"}))[FUNCTION]
    one = TensorSpec(name="x", shape=[1, *spec.shape[1:]], layout=spec.layout)
    n = spec.shape[0]
    for name in ("bikes.mp4", "bigbuckbunny.mp4"):
        frames = video_frames(data_dir, name, 25)
        for i in range(0, len(frames) - n + 1, n):
            batch = np.stack(frames[i : i + n])
            out = tvm.runtime.tensor(np.zeros(spec.shape, np.float32))
            box = crop_box(*batch.shape[1:3], pp)
            xtaps, ytaps = resize_taps(box, pp.interpolation, spec)
            kernel(*(tvm.runtime.tensor(a) for a in (batch, xtaps, ytaps)), out)
            got = out.numpy()
            for b in range(n):
                assert np.array_equal(got[b], preprocess(batch[b], pp, one)[0]), f"{name} frame {i + b}"


@pytest.fixture(scope="module")
def frames_release(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    return frames_bundle(data_dir, tmp_path_factory.mktemp("frames"), 1)


def frames_bundle(data_dir: Path, tmp: Path, batch: int) -> tuple[Path, object]:
    """An MNIST CPU bundle for `batch` with the preprocessing kernel (and postprocess function) added as a GPU
    build adds it (built for the CPU here): written, read back and unpacked as a device does."""
    import tvm

    from edgedeploy.api import build as build_bundle
    from edgedeploy.compile.cards import ModelCard
    from edgedeploy.compile.preprocess_kernel import LIBRARY, ROLE, build

    pp = Preprocess(color="gray", resize="center_crop", crop_fraction=0.875, scale=1 / 255)
    card = ModelCard(name="mnist", version="8", labels=[str(i) for i in range(10)], preprocess=pp)
    plain = tmp / "plain.edb"
    build_bundle(data_dir / "models" / "mnist-8_opset13.onnx", "cpu-x86_64", plain, card, batch=batch)
    manifest = extract_bundle(plain, tmp / "plain")
    files = {a.path: tmp / "plain" / a.path for a in manifest.artifacts}
    files[LIBRARY] = tmp / LIBRARY
    post = manifest.postprocess.model_copy(update={"softmax": True, "top_k": 3})
    manifest = manifest.model_copy(update={"postprocess": post})
    llvm = tvm.target.Target({"kind": "llvm"})
    build(manifest.preprocess, manifest.inputs[0], llvm, post, manifest.outputs[0]).export_library(str(files[LIBRARY]))
    artifacts = [*manifest.artifacts, describe_artifact(files[LIBRARY], ROLE, LIBRARY)]
    write_bundle(tmp / "frames.edb", manifest.model_copy(update={"artifacts": artifacts, "schema_version": 5}), files)
    assert read_manifest(tmp / "frames.edb").artifact(ROLE).path == LIBRARY
    return tmp / "release", extract_bundle(tmp / "frames.edb", tmp / "release")


@pytest.mark.compile
def test_a_library_without_postprocess_keeps_top_k_on_the_host(frames_release: tuple) -> None:
    """A schema-5 bundle built before the postprocess function: its preprocess.so has `preprocess` alone."""
    import tvm

    from edgedeploy.compile.preprocess_kernel import LIBRARY, build
    from edgedeploy_agent.runtime.tvm import TvmRuntime

    rdir, manifest = frames_release
    old = rdir.parent / "old-release"
    shutil.copytree(rdir, old)
    build(manifest.preprocess, manifest.inputs[0], tvm.target.Target({"kind": "llvm"})).export_library(
        str(old / LIBRARY)
    )
    rt = TvmRuntime(old, manifest)
    assert rt.frames_on_device and not rt.top_k_on_device and not rt.describe()["top_k_on_device"]
    assert TvmRuntime(rdir, manifest).top_k_on_device


@pytest.mark.compile
def test_runtime_frame_path_matches_run_and_reuses_its_buffers(data_dir: Path, frames_release: tuple) -> None:
    from edgedeploy_agent.runtime.tvm import TvmRuntime

    rdir, manifest = frames_release
    rt = TvmRuntime(rdir, manifest)
    assert rt.frames_on_device and rt.describe()["frames_on_device"]
    plain = TvmRuntime(
        rdir, manifest.model_copy(update={"artifacts": [a for a in manifest.artifacts if a.role != "tvm-preprocess"]})
    )
    assert not plain.frames_on_device
    # a CPU runtime reads the host's inputs where they are: run() takes them, nothing loads them apart
    assert not plain.loads_inputs and plain.describe()["frame_graphs"] is None
    with pytest.raises(RuntimeError, match="run\\(\\) takes them"):
        plain.load_inputs([np.zeros(manifest.inputs[0].shape, np.float32)])
    frames = video_frames(data_dir, "bigbuckbunny.mp4", 30)
    device_input = rt._inputs[0]
    for frame in frames:
        x = preprocess(frame, manifest.preprocess, manifest.inputs[0])
        rt.load_frames(frame)
        assert np.array_equal(rt.loaded_input(), x)
        want = plain.run([x])[0]
        assert np.array_equal(rt.run_loaded()[0], want)
        # the top k computed by the library's postprocess function: the agent's top_k (tests/host/test_gpu_postprocess)
        called: list[int] = []  # on a CPU the preprocessing has run when load_frames returns: told at once
        top, outs = rt.run_loaded_top(outputs=True, preprocessed=functools.partial(called.append, 1))
        assert np.array_equal(outs[0], want) and top.shape == (1, 2, 3) and called == [1]
        device = [[int(c), round(s * 1e6) / 1e6] for s, c in top[0].T]  # (as labelled rounds)
        assert [[c, s] for c, _, s in top_k(want, manifest, [])] == device
    # one staging buffer per resolution and one per input, allocated once: the same objects after every frame
    staged = list(rt._staging.values())
    assert len(staged) == 1 and rt._inputs[0] is device_input and len(rt._taps) == 1
    rt.load_frames(frames[0])
    assert list(rt._staging.values())[0] is staged[0] and rt._inputs[0] is device_input
    # a batch from frame_batch is the runtime's own buffer: handed back (or its one frame, at batch 1), it is not
    # copied (whole frames go); each call lends another
    batch, other = rt.frame_batch(*frames[0].shape[:2]), rt.frame_batch(*frames[0].shape[:2])
    assert batch.ctypes.data != other.ctypes.data
    for lent, frame in ((batch, frames[0]), (other[0], frames[1])):
        lent[...] = frame
        staged_batch, box = rt.upload_frames(lent)
        assert staged_batch.array.ctypes.data == lent.ctypes.data and box == crop_box(
            *frame.shape[:2], manifest.preprocess
        )
        rt.load_frames(lent)
        assert np.array_equal(rt.loaded_input(), preprocess(frame, manifest.preprocess, manifest.inputs[0]))
    assert len(rt._staging) == 1  # nothing more was staged
    # a batch the caller drops is given back (a camera that changed resolution leaves no lent buffers behind)
    small = rt.frame_batch(120, 160)
    assert len(rt._lent) == 3
    del batch, other, lent, staged_batch
    assert [x.shape for x in rt._lent.values()] == [small.shape]
    del small
    assert rt._lent == {}
    with pytest.raises(ValueError, match=r"the model takes uint8 \(1, H, W, 3\)"):
        rt.load_frames(frames[0].astype(np.float32))


def test_preprocess_writes_into_a_given_input_buffer(data_dir: Path) -> None:
    pp, spec = CASES[0]
    frame = video_frames(data_dir, "bikes.mp4", 100)[0]
    buffer = np.full(spec.shape, np.nan, np.float32)
    assert preprocess(frame, pp, spec, out=buffer) is buffer
    assert np.array_equal(buffer, preprocess(frame, pp, spec))
    wrong = np.zeros((1, 3, 10, 10), np.float32)
    assert preprocess(frame, pp, spec, out=wrong) is not wrong  # not the input's shape: a new array


def _loop_predictions(runtime: object, manifest: object, video: Path, root: Path, lend: bool) -> list:
    """The agent's loop (InferenceLoop, health check on its first frames) over one pass of the video: its
    predictions, from one report."""
    from edgedeploy_agent.config import AgentConfig
    from edgedeploy_agent.loop import InferenceLoop, frame_buffers
    from edgedeploy_agent.sources.capture import open_source
    from edgedeploy_agent.sources.power import NoPowerSensor
    from edgedeploy_agent.spool import Spool, pending_reports
    from edgedeploy_agent.store import DeviceStore

    store = DeviceStore(root)
    cfg = AgentConfig(device_name="t", source=f"file:{video}", report_interval_s=1e9, idle_baseline_s=0.0)
    store.init(cfg)
    loop = InferenceLoop(runtime, manifest, [], cfg, Spool(store), NoPowerSensor(), "t", health_frames=3)  # type: ignore[arg-type]
    source = open_source(cfg.source or "", **(frame_buffers(runtime) if lend else {}))  # type: ignore[arg-type]
    try:
        loop.run(source)
    finally:
        source.close()
    assert source.copied == 0 and source.sent == 0  # (a CPU runtime sends nothing ahead: its kernel reads the batch)
    return [p["top"] for _, r in pending_reports(store) for p in r["predictions"]]


@pytest.mark.compile
def test_the_loop_on_lent_frame_buffers_and_the_device_top_k_predicts_as_the_cpu_path(
    data_dir: Path, frames_release: tuple, tmp_path: Path
) -> None:
    """Capture decoding into the runtime's buffers, preprocessing and top k by the bundle's library: the same
    predictions as preprocess.py, run() and top_k on the host; only the first frame (before the capture knew its
    size) went through a staging copy."""
    from edgedeploy_agent.runtime.tvm import TvmRuntime

    rdir, manifest = frames_release
    video = data_dir / "video" / "bikes.mp4"
    rt = TvmRuntime(rdir, manifest)
    plain = TvmRuntime(
        rdir, manifest.model_copy(update={"artifacts": [a for a in manifest.artifacts if a.role != "tvm-preprocess"]})
    )
    device = _loop_predictions(rt, manifest, video, tmp_path / "device", lend=True)
    assert len(device) == len(video_frames(data_dir, "bikes.mp4", 1))
    assert device == _loop_predictions(plain, manifest, video, tmp_path / "host", lend=False)
    assert len(rt._staging) == 1 and rt._lent == {}  # the capture's lent buffers were given back when it closed


@pytest.mark.compile
def test_a_batch_of_sources_preprocessed_on_the_device_predicts_as_the_cpu_path(data_dir: Path, tmp_path: Path) -> None:
    """Two sources (two copies of a video, so one resolution) through a batch-2 bundle's kernels in one load and
    one call, against preprocess.py into the rows and run(): the same predictions, per source, frame by frame."""
    from edgedeploy_agent.batcher import MultiSourceLoop
    from edgedeploy_agent.config import AgentConfig
    from edgedeploy_agent.runtime.tvm import TvmRuntime
    from edgedeploy_agent.sources.capture import open_source
    from edgedeploy_agent.sources.power import NoPowerSensor
    from edgedeploy_agent.spool import Spool, pending_reports
    from edgedeploy_agent.store import DeviceStore

    rdir, manifest = frames_bundle(data_dir, tmp_path, 2)
    frames = video_frames(data_dir, "bigbuckbunny.mp4", 1)
    flipped = cv2.VideoWriter(str(tmp_path / "b.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 25, frames[0].shape[1::-1])
    for f in frames:  # the other source: the same size, other pictures (a row given to the wrong source shows)
        flipped.write(f[::-1].copy())
    flipped.release()
    (tmp_path / "a.mp4").symlink_to(data_dir / "video" / "bigbuckbunny.mp4")
    uris = [f"file:{tmp_path / 'a.mp4'}", f"file:{tmp_path / 'b.avi'}"]

    lent: list[int] = []  # how many frame batches the runtime had lent when the loop ended (while it lives)

    def predictions(runtime: TvmRuntime, root: Path) -> dict[str, list]:
        store = DeviceStore(root)
        cfg = AgentConfig(device_name="t", report_interval_s=1e9, sources=uris, idle_baseline_s=0.0)
        store.init(cfg)
        sources = [open_source(u) for u in uris]
        loop = MultiSourceLoop(runtime, manifest, [], cfg, Spool(store), NoPowerSensor(), "t", health_frames=3)
        try:
            loop.serve(sources)  # to the end: every frame of each, whatever the calls held
            lent.append(len(runtime._lent))
        finally:
            for s in sources:
                s.close()
        return {r["source"]: r["predictions"] for _, r in pending_reports(store)}

    rt = TvmRuntime(rdir, manifest)
    plain = TvmRuntime(
        rdir, manifest.model_copy(update={"artifacts": [a for a in manifest.artifacts if a.role != "tvm-preprocess"]})
    )
    device = predictions(rt, tmp_path / "device")
    assert rt.top_k_on_device and lent == [1] and not rt._staging  # the batch went whole, once lent
    assert rt._lent == {}  # and was given back with the loop
    assert [[p["frame"] for p in device[u]] for u in uris] == [list(range(len(frames)))] * 2
    assert device[uris[0]] != device[uris[1]]
    assert device == predictions(plain, tmp_path / "host")


def test_the_device_buffer_of_a_resolution_goes_with_its_last_lent_batch() -> None:
    """On a GPU every lent batch of one resolution shares one device buffer (of its crop box): it is freed with
    the last of them. A batch lent `ahead` has its own (freed with it): it neither keeps nor frees the shared one."""
    from edgedeploy_agent.runtime.tvm import _given_back, _Lent

    hd, vga = (1, 720, 1280, 3), (1, 480, 640, 3)
    hd_box, vga_box = (1, 630, 630, 3), (1, 420, 420, 3)
    lent = {
        1: _Lent(hd, "h1", "d-hd", hd_box, None),
        2: _Lent(hd, "h2", "d-hd", hd_box, None),
        3: _Lent(vga, "h3", "d-vga", vga_box, None),
        4: _Lent(hd, "h4", "d-own", hd_box, None, ahead=True),
    }
    device_frames = {hd_box: "d-hd", vga_box: "d-vga"}
    _given_back(lent, device_frames, (), None, 1)
    assert set(lent) == {2, 3, 4} and set(device_frames) == {hd_box, vga_box}
    _given_back(lent, device_frames, (), None, 2)  # the last shared hd batch: batch 4's own buffer does not count
    assert set(lent) == {3, 4} and set(device_frames) == {vga_box}
    _given_back(lent, device_frames, (), None, 2)  # twice (or never lent): nothing more happens
    assert set(lent) == {3, 4} and set(device_frames) == {vga_box}
    device_frames[hd_box] = "d-hd again"
    _given_back(lent, device_frames, (), None, 4)
    assert set(lent) == {3} and set(device_frames) == {hd_box, vga_box}


@pytest.mark.compile
def test_the_gpu_bench_compares_the_device_top_k_as_the_agent_reports_it(data_dir: Path, frames_release: tuple) -> None:
    """bench/gpu_pipeline.py's agreement check, on a card with a label offset (MobileNet's background class): the
    device's top k, labelled as the agent labels it, against top_k on the same outputs (it had compared label
    indices with output indices and reported every MobileNet frame as differing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    from gpu_pipeline import agreement

    from edgedeploy_agent.runtime.tvm import TvmRuntime

    rdir, manifest = frames_release
    manifest = manifest.model_copy(update={"postprocess": manifest.postprocess.model_copy(update={"label_offset": 1})})
    plain = manifest.model_copy(update={"artifacts": [a for a in manifest.artifacts if a.role != "tvm-preprocess"]})
    got = agreement(TvmRuntime(rdir, plain), TvmRuntime(rdir, manifest), manifest, data_dir / "video" / "bikes.mp4")
    assert got["frames"] > 0 and got["max_abs_input_diff"] == 0 and got["top1_changed"] == 0
    assert got["top_k_classes_differ"] == 0 and got["max_abs_top_k_score_diff"] <= 1e-12, got
