"""Two cameras, one agent, one batched bundle (issue 36 part 3): the real agent (process mode) serves two video
files through a TVM CPU build of MNIST compiled for batch 2; each source's frames go into shared calls and each
source's predictions come back to it (checked against its own digits' labels: outputs split the wrong way round
would score about 10 %), with a report stream and a health entry per source."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from edgedeploy.api import build
from tests.helpers import agent
from tests.integration.conftest import MNIST_CARD, LabeledVideo, read_mnist, write_digits_video

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mnist_batch2(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "mnist-b2.cpu-x86_64.edb"
    build(data_dir / "models" / "mnist-8_opset13.onnx", "cpu-x86_64", out, MNIST_CARD, batch=2)
    return out


def _reports(root: Path) -> list[dict]:
    out = [json.loads(p.read_text()) for p in (root / "spool").glob("*.jsonl")]
    return sorted(out, key=lambda r: r["seq"])


@pytest.mark.compile
def test_two_video_files_share_one_batched_bundle(
    tmp_path: Path, data_dir: Path, mnist_batch2: Path, mnist_video: LabeledVideo
) -> None:
    images, labels = read_mnist(data_dir, 500)
    other = write_digits_video(tmp_path / "other.avi", images[300:], labels[300:])  # 200 other digits
    videos = {f"file:{mnist_video.path}": mnist_video, f"file:{other.path}": other}
    root = tmp_path / "root"
    init = ["--root", str(root), "--json", "init", "--service", "process", "--report-interval", "0.5"]
    assert agent(*init, *[a for uri in videos for a in ("--source", uri)], "--max-batch-wait-ms", "500").code == 0
    staged = root / "incoming" / "b.edb"
    shutil.copy(mnist_batch2, staged)
    r = agent("--root", str(root), "--json", "deploy", str(staged), "--timeout", "120")
    try:
        assert json.loads(r.out.splitlines()[-1])["ok"], r.out + r.err
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            health = json.loads((root / "models" / "default" / "run" / "health.json").read_text())
            if health["state"] in ("finished", "failed"):
                break
            time.sleep(0.2)
        assert health["state"] == "finished", health
    finally:
        agent("--root", str(root), "--json", "stop")
    assert health["inferences"] == 500
    assert {s["source"]: s["frames"] for s in health["sources"]} == {u: len(v.labels) for u, v in videos.items()}
    reports = _reports(root)
    for uri, video in videos.items():
        mine = [x for x in reports if x["source"] == uri]
        assert sum(x["frames"] for x in mine) == len(video.labels) and mine[-1]["final"]
        predictions = [p for x in mine for p in x["predictions"]]
        assert [p["frame"] for p in predictions] == list(range(len(video.labels)))
        top1 = sum(p["top"][0][0] == int(video.labels[p["frame"]]) for p in predictions) / len(predictions)
        assert top1 > 0.9, (uri, top1)
        served = [x for x in mine if x["frames"]]
        assert all(x["schema_version"] == 3 and x["batch"]["size"] == 2 and x["batch"]["sources"] == 2 for x in served)
        assert all(x["frame_latency_ms"]["p99"] >= x["latency_ms"]["infer"]["p50"] for x in served)
    # while both played, their frames shared calls: the shorter clip's frames were all in full batches
    short = [x for x in reports if x["source"] == f"file:{other.path}" and x["frames"]]
    assert all(x["batch"]["mean_fill"] == 2.0 for x in short), [x["batch"] for x in short]
