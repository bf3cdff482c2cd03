"""The on-device TensorRT engine cache: keys, lookup, locked atomic writes, timing caches, bad marks.

ENGINES/<key>/plan          the serialized engine
ENGINES/<key>/plan.json     every field of the key (compared again on load) and the build record
ENGINES/<key>/bad.json      written when the engine failed its acceptance check (never served again)
ENGINES/timing/<trt>-<gpu>.cache   one TensorRT timing cache per (TensorRT version, GPU), shared by models
ENGINES/.lock               flock(2) held while an engine is built and written

Engines are not portable (reference notes §3): the key holds everything a plan depends on.
"""

import fcntl
import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

from ..bundle import Manifest, TensorRTSettings, canonical_json
from ..durable import atomic_folder, write_json_atomic

# Bump when the key's fields or the cache layout change: old entries are then simply not found.
ENGINE_CACHE_SCHEMA = 1


def engine_key_fields(
    manifest: Manifest, settings: TensorRTSettings, onnx_sha256: str, trt_version: str, device: dict[str, Any]
) -> dict[str, Any]:
    """Every input a serialized engine depends on, as plain JSON values."""
    return {
        "schema": ENGINE_CACHE_SCHEMA,
        "tensorrt": trt_version,
        "gpu_name": device.get("gpu_name"),
        "compute_capability": device.get("compute_capability"),
        "cuda_driver": device.get("cuda_driver"),
        "cuda_runtime": device.get("cuda_runtime"),
        "l4t": device.get("l4t"),
        "onnx_sha256": onnx_sha256,
        "quantization": {
            "precision": manifest.quantization.precision,
            "method": manifest.quantization.method,
            "options": manifest.quantization.options,
            "float_layers": manifest.quantization.float_layers,
        },
        "precision": settings.precision,
        "fp16": settings.fp16,
        "profiles": [[p.model_dump(mode="json") for p in profile] for profile in settings.profiles],
        "workspace_bytes": settings.workspace_bytes,
        "builder_optimization_level": settings.builder_optimization_level,
        "dla_core": None,  # GPU only; Xavier's DLA would be a different engine
    }


def engine_key(fields: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(fields)).hexdigest()[:32]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:80]


class EngineCache:
    """Engines under one folder (the agent's ROOT/engines), shared by all releases."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def entry(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str, fields: dict[str, Any]) -> Optional[bytes]:
        """The cached plan for `key` when its recorded fields match exactly and it is not marked bad."""
        d = self.entry(key)
        try:
            meta = json.loads((d / "plan.json").read_text(encoding="utf-8"))
            plan = (d / "plan").read_bytes()
        except (OSError, ValueError):
            return None
        if meta.get("fields") != fields or (d / "bad.json").exists():
            return None
        if meta.get("plan_sha256") != hashlib.sha256(plan).hexdigest():
            return None
        return plan

    def is_bad(self, key: str) -> Optional[dict[str, Any]]:
        try:
            data: dict[str, Any] = json.loads((self.entry(key) / "bad.json").read_text(encoding="utf-8"))
            return data
        except (OSError, ValueError):
            return None

    def store(self, key: str, fields: dict[str, Any], plan: bytes, record: dict[str, Any]) -> Path:
        """Write plan + plan.json into ENGINES/<key> atomically (a temp folder renamed into place); under `lock`."""
        meta = {"fields": fields, "plan_sha256": hashlib.sha256(plan).hexdigest(), **record}
        with atomic_folder(self.entry(key)) as tmp:
            (tmp / "plan").write_bytes(plan)
            (tmp / "plan.json").write_text(json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8")
        return self.entry(key)

    def mark_bad(self, key: str, reason: str, details: dict[str, Any]) -> None:
        d = self.entry(key)
        if d.is_dir():
            write_json_atomic(d / "bad.json", {"reason": reason, **details})

    def timing_cache_path(self, trt_version: str, gpu_name: str) -> Path:
        return self.root / "timing" / f"trt-{_safe(trt_version)}-{_safe(gpu_name)}.cache"

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock across processes: one engine build at a time, and no reader sees half a write."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
