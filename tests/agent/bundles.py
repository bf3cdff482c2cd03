"""Make small real bundles for agent tests (fake library bytes, real format)."""

from __future__ import annotations

import base64
import datetime as dt
import gzip
import io
import tarfile
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgedeploy_agent.bundle import (
    Manifest,
    ModelInfo,
    Postprocess,
    Preprocess,
    Provenance,
    Target,
    TensorSpec,
    describe_artifact,
    read_manifest,
    write_bundle,
)
from edgedeploy_agent.report import Report, stage_latency
from edgedeploy_agent.sources.power import NoPowerSensor
from edgedeploy_agent.trust import KEY_PREFIX


def make_manifest(
    files: dict[str, tuple[Path, str]], version: str = "1", arch: str = "x86_64", **overrides: object
) -> Manifest:
    data = {
        "model": ModelInfo(name="toy", version=version, source_sha256="0" * 64),
        "created": dt.datetime(2026, 11, 29, tzinfo=dt.timezone.utc),
        "profile": "cpu-x86_64",
        "target": Target(arch=arch, device="cpu", runtime="tvm", runtime_abi="tvm-ffi-0.1"),  # type: ignore[arg-type]
        "inputs": [TensorSpec(name="x", shape=[1, 1, 8, 8], layout="NCHW")],
        "outputs": [TensorSpec(name="y", shape=[1, 10])],
        "preprocess": Preprocess(color="gray"),
        "postprocess": Postprocess(),
        "provenance": Provenance(tools={"test": "1"}, build_host="test"),
        "artifacts": [describe_artifact(p, role, name) for name, (p, role) in sorted(files.items())],
    }
    data.update(overrides)
    return Manifest(**data)  # type: ignore[arg-type]


def make_bundle(tmp: Path, version: str = "1", lib_bytes: bytes = b"\x7fELF fake library", **kw: object) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    lib = tmp / f"model-{version}.so"
    lib.write_bytes(lib_bytes)
    labels = tmp / "labels.txt"
    labels.write_text("\n".join(str(i) for i in range(10)) + "\n")
    files = {"model.so": (lib, "tvm-library"), "labels.txt": (labels, "labels")}
    m = make_manifest(files, version=version, labels="labels.txt", **kw)
    return write_bundle(tmp / f"toy-{version}.edb", m, {k: v[0] for k, v in files.items()})


def make_report(seq: int, **overrides: object) -> Report:
    """A small valid report; override any field."""
    fields: dict[str, object] = {
        "device": "d",
        "seq": seq,
        "bundle_id": "b",
        "model": "m",
        "model_version": "1",
        "runtime": "tvm",
        "source": "file:x",
        "window_start": "2026-01-01T00:00:00Z",
        "window_end": f"2026-01-01T00:00:{seq:02d}Z",
        "frames": 1,
        "fps": 1.0,
        "latency_ms": {"infer": stage_latency([1.0])},
        "power": NoPowerSensor().end_window(1),
    }
    fields.update(overrides)
    return Report.model_validate(fields)


def rewrite_bundle(
    src: Path, dst: Path, edit, repeat: str | None = None, after: str | None = None, extra: tuple = ("", b"")
) -> Path:
    """Copy a bundle member by member, letting `edit(name, data)` change or drop members; the member named
    `repeat` is written twice, and `extra` is added after the member named `after`."""

    def add(tout: tarfile.TarFile, name: str, data: bytes) -> None:
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        tout.addfile(ti, io.BytesIO(data))

    with tarfile.open(src, "r|gz") as tin, gzip.open(dst, "wb") as gz, tarfile.open(fileobj=gz, mode="w") as tout:
        for m in tin:
            data = tin.extractfile(m).read()
            res = edit(m.name, data)
            if res is None:
                continue
            name, data = res
            add(tout, name, data)
            if name == repeat:
                add(tout, name, data)
            if name == after:
                add(tout, *extra)
    return dst


def copy(b: Path, d: Path) -> Path:
    """A copy of bundle `b` in folder `d` (as an upload leaves it in the device's incoming folder)."""
    d.mkdir(parents=True, exist_ok=True)
    out = d / b.name
    out.write_bytes(b.read_bytes())
    return out


def public(key: Ed25519PrivateKey) -> str:
    """The key's public half as trust stores pin it (KEY_PREFIX + base64)."""
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_PREFIX + base64.b64encode(raw).decode()


def with_version(bundle: Path, dst: Path, version: str) -> Path:
    """The same bundle under another model version: another release of identical artifacts (unsigned)."""
    old = f'"version":"{read_manifest(bundle).model.version}"'.encode()
    new = f'"version":"{version}"'.encode()
    return rewrite_bundle(bundle, dst, lambda n, d: (n, d.replace(old, new)) if n == "manifest.json" else (n, d))


def reference_runs(bundle: Path) -> int:
    """A TensorRT bundle's engine runs before its first camera frame: one per reference sample (acceptance at
    batch 1), and the warm-up."""
    m = read_manifest(bundle)
    assert m.tensorrt is not None
    with tarfile.open(bundle, "r:gz") as tar:
        member = tar.extractfile(m.tensorrt.reference)
        assert member is not None
        with np.load(io.BytesIO(member.read())) as z:
            return int(z[f"input:{m.inputs[0].name}"].shape[0]) + 1
