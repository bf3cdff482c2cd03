"""Real TVM builds (CPU), the build cache, and the manifest they produce."""

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgedeploy.api import build
from edgedeploy.compile.cards import ModelCard
from edgedeploy.errors import ModelError
from edgedeploy_agent.bundle import Preprocess, extract_bundle
from edgedeploy_agent.runtime import load_runtime
from tests.helpers import Cli


@pytest.mark.compile
def test_mnist_bundle_runs_like_onnxruntime(data_dir: Path, tmp_path: Path) -> None:
    model = data_dir / "models" / "mnist-8_opset13.onnx"
    card = ModelCard(name="mnist", labels=[str(i) for i in range(10)], preprocess=Preprocess(color="gray"))
    res = build(model, "cpu-x86_64", tmp_path / "m.edb", card)
    m = res.manifest
    assert (m.inputs[0].name, m.inputs[0].shape, m.inputs[0].layout) == ("Input3", [1, 1, 28, 28], "NCHW")
    assert (m.outputs[0].name, m.outputs[0].shape) == ("Plus214_Output_0", [1, 10])
    assert {a.role for a in m.artifacts} == {"tvm-library", "labels"}  # the source stays on the host
    assert [(h.role, h.name, h.sha256) for h in m.host_files] == [("onnx-model", model.name, m.model.source_sha256)]
    assert m.provenance.tools["tvm"].startswith("0.27") and m.target.runtime_abi == "tvm-ffi-0.1"
    rel = tmp_path / "rel"
    extract_bundle(res.bundle, rel)
    rt = load_runtime(rel, m)
    x = np.random.default_rng(0).uniform(0, 255, (1, 1, 28, 28)).astype(np.float32)
    ref = ort.InferenceSession(str(model)).run(None, {"Input3": x})[0]
    np.testing.assert_allclose(rt.run([x])[0], ref, rtol=1e-4, atol=1e-3)


@pytest.mark.compile
def test_rebuild_is_cached(data_dir: Path, tmp_path: Path) -> None:
    model = data_dir / "models" / "mnist-8_opset13.onnx"
    card = ModelCard(name="mnist-cache", preprocess=Preprocess(color="gray"))  # one channel, as the model wants
    first = build(model, "cpu-x86_64", tmp_path / "a.edb", card)
    again = build(model, "cpu-x86_64", tmp_path / "b.edb", card)
    assert again.cached and not first.cached  # behaviour, not a timing: no pipeline ran
    assert again.timings == {} and (tmp_path / "b.edb").read_bytes() == (tmp_path / "a.edb").read_bytes()
    assert again.manifest.bundle_id == first.manifest.bundle_id
    changed = build(model, "cpu-x86_64", tmp_path / "c.edb", card.model_copy(update={"version": "2"}))
    assert not changed.cached


def test_corrupt_model(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    with pytest.raises(ModelError, match="bad.onnx is not a valid ONNX model"):
        build(bad, "cpu-x86_64", tmp_path / "x.edb", ModelCard())


@pytest.mark.compile
def test_cli_build_and_inspect_json(data_dir: Path, tmp_path: Path, cli: Cli) -> None:
    out = tmp_path / "mnist.edb"
    r = cli(
        "build",
        str(data_dir / "models" / "mnist-8_opset13.onnx"),
        "--profile",
        "cpu-x86_64",
        "-o",
        str(out),
        "--color",
        "gray",
        "--softmax",
        "--top-k",
        "3",
    )
    assert r.code == 0, r.err
    r = cli("inspect", str(out), "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    assert data["profile"] == "cpu-x86_64" and data["preprocess"]["color"] == "gray"
    assert data["postprocess"]["top_k"] == 3 and len(data["bundle_id"]) == 16


@pytest.mark.compile
def test_known_models_find_their_card(data_dir: Path, tmp_path: Path, cli: Cli) -> None:
    from edgedeploy.compile.cards import card_for

    card, path = card_for(data_dir / "models" / "mobilenet_v1_0.25_224.onnx", None)
    assert path is not None and path.name == "mobilenet_v1_0.25_224.toml"
    assert (card.preprocess.resize, card.postprocess.label_offset) == ("center_crop", 1)
    unknown = tmp_path / "other.onnx"
    unknown.write_bytes((data_dir / "models" / "mnist-8_opset13.onnx").read_bytes() + b"\0")
    assert card_for(unknown, None) == (ModelCard(), None)
    r = cli(
        "build",
        str(data_dir / "models" / "mnist-8_opset13.onnx"),
        "--profile",
        "cpu-x86_64",
        "-o",
        str(tmp_path / "m.edb"),
    )
    assert r.code == 0 and "mnist-8.toml (it names this model's sha256)" in r.err, r.err


@pytest.mark.compile
def test_int8_gate_refuses_to_judge_nonsense(data_dir: Path, tmp_path: Path, cli: Cli) -> None:
    """Preprocessing that does not fit the model (FP32 scores 0%) must not pass an accuracy gate."""
    card = tmp_path / "wrong.toml"  # labels that do not fit the outputs are refused before (test_model_cards.py)
    card.write_text('name = "mnv1"\n[preprocess]\nmean = [255.0]\nstd = [0.01]\n[postprocess]\nlabel_offset = 1\n')
    r = cli(
        "build",
        str(data_dir / "models" / "mobilenet_v1_0.25_224.onnx"),
        "--profile",
        "cpu-x86_64",
        "--card",
        str(card),
        "--int8",
        "--calibration",
        str(data_dir / "imagenet-sample"),
        "--samples",
        "8",
        "--eval",
        str(data_dir / "imagenet-sample"),
        "--eval-limit",
        "20",
        "--max-top1-drop",
        "1.0",
        "-o",
        str(tmp_path / "x.edb"),
    )
    assert r.code != 0 and "scores 0% top-1" in r.err, r.err
    assert not (tmp_path / "x.edb").exists()


def test_every_bundle_writer_carries_the_card(data_dir: Path, tmp_path: Path) -> None:
    """card_manifest is the one place a card becomes manifest fields (TVM and TensorRT writers both use it)."""
    from edgedeploy.compile.frontends.onnx_model import load_onnx
    from edgedeploy.compile.manifest import card_manifest, write_labels
    from edgedeploy.profiles import get_profile
    from edgedeploy_agent.bundle import HealthSpec, Provenance, Quantization, Target

    model = load_onnx(data_dir / "models" / "mnist-8_opset13.onnx")
    card = ModelCard(labels=["a", "b"], health=HealthSpec(min_inferences=5), preprocess=Preprocess(color="gray"))
    files: dict[str, Path] = {}
    write_labels(tmp_path, card, files)
    m = card_manifest(
        card, model, "mnist", get_profile("t4"),
        Target(arch="x86_64", device="cuda", cuda_sm=75, runtime="tensorrt", runtime_abi="tensorrt-10"),
        [], files, Quantization(precision="int8"), Provenance(tools={}, build_host="test"),
    )  # fmt: skip
    assert m.health == HealthSpec(min_inferences=5) and m.labels == "labels.txt"
    assert m.preprocess.color == "gray" and {a.role for a in m.artifacts} == {"labels"}
    assert [(h.role, h.sha256) for h in m.host_files] == [("onnx-model", model.sha256)]
