"""Real bundles altered for the integration tests."""

from __future__ import annotations

from pathlib import Path

from edgedeploy_agent.bundle import Preprocess, extract_bundle, write_bundle


def crashing_on_real_frames(good: Path, out: Path) -> Path:
    """mnist with three channel means for its one-channel input, as `build` wrote it before it refused
    that: the warm-up (zeros of the input's shape) passes, the first real frame cannot feed the model."""
    work = out.parent / ".crash"
    m = extract_bundle(good, work)
    bad = m.model_copy(
        update={
            "preprocess": Preprocess(color="gray", interpolation="area", mean=[1.0, 2.0, 3.0], std=[1.0]),
            "model": m.model.model_copy(update={"version": "crash"}),
        }
    )
    return write_bundle(out, bad, {a.path: work / a.path for a in bad.artifacts})
