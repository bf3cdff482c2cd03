"""Checks what the agent reported from the GPU machine against onnxruntime on this machine, frame by
frame, through the agent's own preprocessing:

    python bench/gpu_check.py OUT/reports.json BUNDLE VIDEO      (OUT: bench/gpu_e2e.sh's, brought back here)

Prints how many frames' top-1 equals onnxruntime's (exit 1 unless all), the largest score difference, and the
agent's latency, fps and power from its last report.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort

from edgedeploy.build_store import host_file
from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.preprocess import preprocess


def main(reports_path: str, bundle: str, video: str) -> int:
    reports = [item["report"] for item in json.loads(Path(reports_path).read_text())["reports"]]
    preds = {p["frame"]: p["top"] for r in reports for p in r["predictions"]}
    rel = Path(tempfile.mkdtemp()) / "rel"
    m = extract_bundle(Path(bundle), rel)
    sess = ort.InferenceSession(str(host_file(m, "onnx-model", rel)))  # the bundle's source, from the build store
    cap = cv2.VideoCapture(video)
    same, diffs, n = 0, [], 0
    while True:
        ok, frame = cap.read()
        if not ok or n not in preds:
            break
        x = preprocess(frame, m.preprocess, m.inputs[0])
        ref = sess.run(None, {m.inputs[0].name: x})[0][0]
        top = preds[n][0]
        same += int(int(np.argmax(ref)) - m.postprocess.label_offset == top[0])
        diffs.append(abs(float(ref[top[0] + m.postprocess.label_offset]) - top[2]))
        n += 1
    lat = reports[-1]["latency_ms"]
    print(
        f"frames compared: {n} of {len(preds)} reported; top-1 equal to onnxruntime: {same}/{n} "
        f"({same / max(n, 1):.1%}); max |score diff| {max(diffs):.2e}"
    )
    print(
        "agent latency ms (p50/p95/p99): "
        + "; ".join(f"{s} {v['p50']:.3f}/{v['p95']:.3f}/{v['p99']:.3f}" for s, v in lat.items())
    )
    print(f"fps (busy time): {reports[-1]['fps']}, power: {reports[-1]['power']}")
    return 0 if n and same == n else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
