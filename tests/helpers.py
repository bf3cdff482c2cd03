"""Small helpers shared by tests (not fixtures)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


@dataclass
class Ran:
    code: int
    out: str
    err: str


class Cli:
    def __call__(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> Ran:
        p = subprocess.run(
            [str(BIN / "edgedeploy"), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            stdin=subprocess.DEVNULL,
        )
        return Ran(p.returncode, p.stdout, p.stderr)


def agent(*args: str, timeout: float = 120) -> Ran:
    p = subprocess.run(
        [str(BIN / "edgedeploy-agent"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return Ran(p.returncode, p.stdout, p.stderr)


def assert_one_line_error(r: Ran, code: int | None = None, contains: str = "") -> None:
    """A failed command prints `error: ...` (and maybe `hint: ...`), never a traceback."""
    assert r.code != 0, r
    if code is not None:
        assert r.code == code, r
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip() and not ln.startswith("hint:")]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1, r.err
    assert contains.lower() in errors[0].lower(), r.err


def schema1_bundle(bundle: Path, out: Path, host_files: dict[str, Path]) -> Path:
    """`bundle` as edgedeploy wrote it before host-only files left bundles (schema 1): they ride along as
    artifacts (`host_files`: role -> file; model.onnx, model.qdq.onnx) and the manifest has no host_files."""
    from edgedeploy_agent.bundle import describe_artifact, extract_bundle, write_bundle

    unpacked = out.with_name(out.stem + "-files")
    m = extract_bundle(bundle, unpacked)
    names = {"onnx-model": "model.onnx", "qdq-onnx": "model.qdq.onnx"}
    files = {a.path: unpacked / a.path for a in m.artifacts} | {names[r]: p for r, p in host_files.items()}
    arts = [*m.artifacts, *(describe_artifact(p, r, names[r]) for r, p in host_files.items())]
    old = m.model_copy(update={"schema_version": 1, "artifacts": sorted(arts, key=lambda a: a.path), "host_files": []})
    return write_bundle(out, old, files)
