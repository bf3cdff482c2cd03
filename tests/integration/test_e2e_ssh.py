"""The whole path over a real sshd: build -> enroll -> push -> agent on video -> status.

The agent's predictions must equal onnxruntime's on the same decoded frames, and its accuracy must
match the MNIST labels (mnist-8 scores 98.9% on the full test set).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from edgedeploy_agent.bundle import read_manifest
from edgedeploy_agent.preprocess import preprocess
from tests.helpers import Cli, schema1_bundle
from tests.integration.conftest import Enrolled, LabeledVideo

pytestmark = pytest.mark.integration


def wait_for_agent(cli: Cli, dev: Enrolled, timeout: float = 120) -> dict:
    """Until the agent has played the whole (play-once) video and exited healthy."""
    deadline = time.monotonic() + timeout
    facts: dict = {}
    while time.monotonic() < deadline:
        r = cli("devices", "facts", dev.name, "--json", *dev.args())
        assert r.code == 0, r.err
        facts = json.loads(r.out)
        if facts["healthy_release"] and not facts["running"]:
            return facts
        time.sleep(0.3)
    raise AssertionError(f"agent did not finish: {facts}")


def test_enroll_pins_the_real_host_key(cli: Cli, device: Enrolled) -> None:
    expected = subprocess.run(
        ["ssh-keygen", "-lf", str(device.sshd.host_key) + ".pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    known = (device.inventory.parent / "known_hosts").read_text()
    assert f"[127.0.0.1]:{device.sshd.port} ssh-ed25519" in known
    r = cli("devices", "enroll", device.name, "--yes", "--json", *device.args())
    assert r.code == 0 and json.loads(r.out)["fingerprint"] == expected


def test_push_run_status_matches_onnxruntime(
    cli: Cli, device: Enrolled, mnist_bundle: Path, mnist_video: LabeledVideo, data_dir: Path
) -> None:
    plan = cli("push", device.name, str(mnist_bundle), "--dry-run", *device.args())
    assert plan.code == 0 and "will  upload" in plan.out and "will  deploy" in plan.out, plan.out + plan.err

    r = cli("push", device.name, str(mnist_bundle), "--json", *device.args())
    assert r.code == 0, r.err
    pushed = json.loads(r.out)
    manifest = read_manifest(mnist_bundle)
    assert pushed["outcome"] == "committed" and pushed["release"] == manifest.release_name
    assert pushed["health"]["state"] in ("ready", "finished")
    assert (device.root / "models" / "default" / "current").resolve().name == manifest.release_name

    wait_for_agent(cli, device)
    r = cli("status", device.name, "--json", *device.args())
    assert r.code == 0, r.err
    st = json.loads(r.out)
    reports = st["new_reports"]
    assert reports and reports[-1]["final"] and all(x["bundle_id"] == manifest.bundle_id for x in reports)
    for rep in reports:
        for stage in ("capture", "preprocess", "infer", "postprocess"):
            lat = rep["latency_ms"][stage]
            assert 0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
        assert rep["power"]["status"] == "unavailable" and rep["power"]["reason"]
    preds = {p["frame"]: p["top"] for rep in reports for p in rep["predictions"]}
    n = len(mnist_video.labels)
    assert sorted(preds) == list(range(n))

    # onnxruntime on the very frames the agent saw, through the same preprocessing code
    sess = ort.InferenceSession(str(data_dir / "models" / "mnist-8_opset13.onnx"))
    cap = cv2.VideoCapture(str(mnist_video.path))
    ort_top1 = []
    for _ in range(n):
        ok, frame = cap.read()
        assert ok
        x = preprocess(frame, manifest.preprocess, manifest.inputs[0])
        ort_top1.append(int(np.argmax(sess.run(None, {"Input3": x})[0])))
    cap.release()
    agent_top1 = [int(preds[i][0][0]) for i in range(n)]
    assert agent_top1 == ort_top1
    accuracy = float(np.mean(np.array(agent_top1) == mnist_video.labels))
    assert accuracy >= 0.97, accuracy

    # status again: nothing new, everything kept locally
    again = json.loads(cli("status", device.name, "--json", *device.args()).out)
    assert again["new_reports"] == [] and again["reports_total"] == len(reports)
    r = cli("status", device.name, *device.args())
    assert r.code == 0 and "p95" in r.out and "infer" in r.out


def test_a_schema_1_bundle_with_its_source_inside_still_pushes(
    cli: Cli, device: Enrolled, mnist_bundle: Path, data_dir: Path, tmp_path: Path
) -> None:
    """A bundle built before host-only files left bundles (schema 1, model.onnx inside) deploys as it did."""
    old = schema1_bundle(
        mnist_bundle, tmp_path / "old.edb", {"onnx-model": data_dir / "models" / "mnist-8_opset13.onnx"}
    )
    manifest = read_manifest(old)
    assert manifest.schema_version == 1 and not manifest.host_files
    r = cli("push", device.name, str(old), "--json", *device.args())
    assert r.code == 0, r.err
    pushed = json.loads(r.out)
    assert pushed["outcome"] == "committed" and pushed["release"] == manifest.release_name
    assert (device.root / "models" / "default" / "current" / "model.onnx").read_bytes() == (
        data_dir / "models" / "mnist-8_opset13.onnx"
    ).read_bytes()
    wait_for_agent(cli, device)
