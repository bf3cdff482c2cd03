"""Slim bundles: the device gets what it runs; the source model stays in the host's build store, named in
the manifest by sha256. `eval` and `tune` find it there or take it with --source (checked by sha256); a
missing entry is one line with a hint; schema 1 bundles (source inside) still unpack, deploy and evaluate."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.api import build
from edgedeploy.build_store import restore, stored_path
from edgedeploy.compile.cards import ModelCard
from edgedeploy_agent.bundle import HostFile, Preprocess, extract_bundle, read_manifest, read_signed_manifest
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.lifecycle import Deployment
from edgedeploy_agent.runtime import load_runtime
from edgedeploy_agent.service import write_health
from edgedeploy_agent.store import DeviceStore
from tests.helpers import Cli, assert_one_line_error, schema1_bundle

pytestmark = pytest.mark.compile

MNIST = "models/mnist-8_opset13.onnx"
CARD = ModelCard(name="mnist", labels=[str(i) for i in range(10)], preprocess=Preprocess(color="gray"))


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build store of this test's own (the build cache stays shared: a cache hit must restock it)."""
    monkeypatch.setenv("EDGEDEPLOY_STORE_DIR", str(tmp_path / "store"))
    return tmp_path / "store"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tvm_bundle_holds_the_library_and_the_store_the_source(data_dir: Path, tmp_path: Path, store: Path) -> None:
    model = data_dir / MNIST
    res = build(model, "cpu-x86_64", tmp_path / "m.edb", CARD)
    with tarfile.open(res.bundle) as tar:
        assert tar.getnames() == ["manifest.json", "labels.txt", "model.so"]
    [hf] = res.manifest.host_files
    assert hf == HostFile(name=model.name, role="onnx-model", sha256=_sha(model), size=model.stat().st_size)
    assert hf.sha256 == res.manifest.model.source_sha256 and read_manifest(res.bundle).host_files == [hf]
    entry = stored_path(hf.sha256)
    assert entry == store / "sha256" / hf.sha256 and entry.read_bytes() == model.read_bytes()
    assert not os.access(entry, os.W_OK) or os.geteuid() == 0  # read-only (root writes anyway)
    # the store lost it: a rebuild is still a cache hit (the source is at hand) and stores it again
    entry.unlink()
    again = build(model, "cpu-x86_64", tmp_path / "m2.edb", CARD)
    assert again.cached and entry.read_bytes() == model.read_bytes()
    # a Q/DQ model is not at hand: a cache entry that needs one the store lost is compiled again
    qdq = HostFile(name="model.qdq.onnx", role="qdq-onnx", sha256="cd" * 32, size=1)
    needs = res.manifest.model_copy(update={"host_files": [hf, qdq]})
    assert not restore(needs, {hf.sha256: model}) and restore(res.manifest, {})


def test_eval_and_tune_use_the_store_then_a_clean_error_then_source(
    cli: Cli, data_dir: Path, tmp_path: Path, store: Path
) -> None:
    model = data_dir / MNIST
    bundle = build(model, "cpu-x86_64", tmp_path / "m.edb", CARD).bundle
    entry = stored_path(_sha(model))
    ev = ["eval", str(bundle), "--data", str(data_dir / "mnist"), "--limit", "64", "--json"]
    r = cli(*ev)
    assert r.code == 0, r.err
    first = json.loads(r.out)
    assert first["images"] == 64 and first["fp32_onnxruntime"]["top1"] > 90
    r = cli("tune", str(bundle), "--export", str(tmp_path / "e1"), "--json")
    assert r.code == 0, r.err

    entry.unlink()
    r = cli("inspect", str(bundle), "--json")
    assert r.code == 0 and json.loads(r.out)["host_store"] == {"path": str(store), "missing": [model.name]}
    assert "MISSING from the build store" in cli("inspect", str(bundle)).out
    for args in (ev, ["tune", str(bundle), "--export", str(tmp_path / "e2")]):
        r = cli(*args)
        assert_one_line_error(r, 2, "is not in the build store")
        assert "--source PATH" in r.err and model.name in r.err
    assert not (tmp_path / "e2").exists()
    r = cli(*ev, "--source", str(data_dir / "models" / "mobilenet_v1_0.25_224.onnx"))
    assert_one_line_error(r, 2, "is not a file bundle mnist was built from")

    r = cli(*ev, "--source", str(model))
    assert r.code == 0, r.err
    assert json.loads(r.out) == first and entry.read_bytes() == model.read_bytes()  # and stored again
    entry.chmod(0o644)
    entry.write_bytes(b"not the model")
    assert_one_line_error(cli(*ev), 2, "is corrupt in the build store")
    entry.unlink()
    r = cli("tune", str(bundle), "--export", str(tmp_path / "e3"), "--source", str(model), "--json")
    assert r.code == 0, r.err
    assert (tmp_path / "e3" / "tuning.json").read_text() == (tmp_path / "e1" / "tuning.json").read_text()


class LoadingService:
    """Acts like the agent on restart: loads `current` with the real runtime and runs one inference."""

    def __init__(self, store: DeviceStore) -> None:
        self.store, self.running = store, False

    def restart(self) -> None:
        name = self.store.current()
        assert name is not None
        m = self.store.load_release(name)
        rt = load_runtime(self.store.release_dir(name), m)
        out = rt.run([np.zeros(m.inputs[0].shape, dtype=np.float32)])[0]
        self.running = bool(np.isfinite(out).all())
        write_health(self.store, name, "ready" if self.running else "failed")

    def stop(self) -> None:
        self.running = False

    def is_running(self) -> bool:
        return self.running


def test_schema_1_bundle_with_the_source_inside_unpacks_deploys_and_evaluates(
    cli: Cli, data_dir: Path, tmp_path: Path, store: Path
) -> None:
    model = data_dir / MNIST
    new = build(model, "cpu-x86_64", tmp_path / "m.edb", CARD).bundle
    old = schema1_bundle(new, tmp_path / "old.edb", {"onnx-model": model})
    shutil.rmtree(store)  # nothing on this host: the bundle carries its source
    m, body, _ = read_signed_manifest(old)
    assert m.schema_version == 1 and b"host_files" not in body
    assert {a.role for a in m.artifacts} == {"tvm-library", "onnx-model", "labels"}
    rel = tmp_path / "rel"
    assert extract_bundle(old, rel).bundle_id == m.bundle_id and (rel / "manifest.json").read_bytes() == body
    assert (rel / "model.onnx").read_bytes() == model.read_bytes()

    device = DeviceStore(tmp_path / "device")
    device.init(AgentConfig(device_name="t", keep_releases=2))
    shutil.copyfile(old, device.incoming / old.name)
    r = Deployment(device, LoadingService(device)).deploy(device.incoming / old.name, timeout=5)
    assert r["outcome"] == "committed" and device.current() == m.release_name

    r = cli("eval", str(old), "--data", str(data_dir / "mnist"), "--limit", "64", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["fp32_onnxruntime"]["top1"] > 90
    r = cli("tune", str(old), "--export", str(tmp_path / "e"), "--json")
    assert r.code == 0, r.err
    assert not store.exists()
